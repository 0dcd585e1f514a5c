// The MCP TypeScript SDK's client: lists the tools at the URL given, calls get_report once
// with valid arguments and once with arguments that break its schema, prints what it got.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const url = new URL(process.argv[2]);
const client = new Client({ name: "replay-proxy-test", version: "0.0.0" });
const transport = new StreamableHTTPClientTransport(url, {
  requestInit: { headers: { Authorization: "Bearer sk-ts" } },
});
await client.connect(transport);
const listed = await client.listTools();
const outcomes = { tools: listed.tools.map((t) => t.name) };
for (const [name, args] of [
  ["valid", { region: "eu" }],
  ["failing", { region: "mars" }],
]) {
  try {
    outcomes[name] = await client.callTool({ name: "get_report", arguments: args });
  } catch (error) {
    outcomes[name] = { thrown: error.constructor.name, code: error.code, message: error.message };
  }
}
await transport.terminateSession();
await client.close();
console.log(JSON.stringify(outcomes));
