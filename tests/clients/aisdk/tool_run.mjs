// One AI SDK tool loop through an Open Responses endpoint: generateText with one tool and two
// steps (the model calls the tool, then answers with its result). Prints the final text.
//
//   node tool_run.mjs http://127.0.0.1:8787/v1 ["what are the latest sales?"]
import { createOpenResponses } from "@ai-sdk/open-responses";
import { generateText, jsonSchema, stepCountIs, tool } from "ai";

const [base, prompt = "what are the latest sales?"] = process.argv.slice(2);
if (!base) {
  console.error("usage: node tool_run.mjs BASE_URL [PROMPT]   (e.g. http://127.0.0.1:8787/v1)");
  process.exit(2);
}

const provider = createOpenResponses({
  name: "replay-proxy-test",
  url: `${base.replace(/\/+$/, "")}/responses`,
  apiKey: "sk-aisdk-client",
});

const salesReport = tool({
  description: "The latest sales report for a region.",
  inputSchema: jsonSchema({
    type: "object",
    additionalProperties: false,
    required: ["region"],
    properties: { region: { type: "string", enum: ["apac", "emea", "amer"] } },
  }),
  execute: async ({ region }) => `${region}: 42 units`,
});

const { text } = await generateText({
  model: provider("scripted"),
  prompt,
  tools: { get_latest_sales_report: salesReport },
  stopWhen: stepCountIs(2),
  maxRetries: 0,
});
process.stdout.write(text + "\n");
