// One AI SDK tool loop through a Chat Completions endpoint (@ai-sdk/openai-compatible):
// generateText with one tool, up to five steps. Prints the final text; a refused request
// prints `refused <status>: <message>` and exits 3.
//
//   node chat_run.mjs http://127.0.0.1:8787/v1 "Where is order A-1042?"
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { APICallError, generateText, jsonSchema, stepCountIs, tool } from "ai";

const [base, prompt] = process.argv.slice(2);
if (!base || !prompt) {
  console.error("usage: node chat_run.mjs BASE_URL PROMPT   (e.g. http://127.0.0.1:8787/v1)");
  process.exit(2);
}

const provider = createOpenAICompatible({
  name: "replay-proxy-test",
  baseURL: base.replace(/\/+$/, ""),
  apiKey: "sk-chat-client",
});

// No validation of the model's input here: the tool runs with whatever the model gave it, as
// the Python clients' tool does (tests/server/chat_loops.py).
const lookupOrder = tool({
  description: "Look an order up by its id.",
  inputSchema: jsonSchema({
    type: "object",
    properties: { order_id: { type: "string", pattern: "^[A-Z]-\\d{4}$" } },
    required: ["order_id"],
    additionalProperties: false,
  }),
  execute: async ({ order_id }) => `order ${order_id}: shipped`,
});

try {
  const { text } = await generateText({
    model: provider.chatModel("scripted"),
    prompt,
    tools: { lookup_order: lookupOrder },
    stopWhen: stepCountIs(5),
    maxRetries: 0,
  });
  process.stdout.write(text + "\n");
} catch (error) {
  if (!APICallError.isInstance(error)) throw error;
  process.stdout.write(`refused ${error.statusCode}: ${error.message}\n`);
  process.exit(3);
}
