// Calls one tool of an MCP server over streamable HTTP with the official TypeScript SDK
// (@modelcontextprotocol/sdk, pinned in package.json), and prints what came back as one JSON line.
//
//     node client.mjs URL BEARER TOOL ARGUMENTS_JSON
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, bearer, tool, argumentsJson] = process.argv.slice(2);
const headers = bearer ? { Authorization: `Bearer ${bearer}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } });
const client = new Client({ name: "hark-test", version: "1.0.0" });
await client.connect(transport);
try {
  if (tool === "tools/list") {
    const listed = await client.listTools();
    console.log(JSON.stringify({ tools: listed.tools.map((t) => t.name) }));
  } else {
    const result = await client.callTool({ name: tool, arguments: JSON.parse(argumentsJson) }, undefined, { timeout: 300000 });
    const text = result.content.filter((c) => c.type === "text").map((c) => c.text).join("");
    console.log(JSON.stringify({ is_error: Boolean(result.isError), text, structured: result.structuredContent ?? null }));
  }
} finally {
  await client.close();
}
