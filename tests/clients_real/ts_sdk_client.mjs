// The TypeScript SDK's client (npm @modelcontextprotocol/sdk), driven by the Python tests.
//
// Commands arrive one JSON object per line on stdin; one JSON answer per line goes to stdout:
//   {"op": "connect", "command": "...", "args": [...]}          stdio: spawn the server
//   {"op": "connect", "url": "...", "headers": {...}}           streamable HTTP; the headers go
//                                                               on every request (requestInit)
//   {"op": "call", "name": "...", "arguments": {...}, "meta": {...}}   tools/call (meta optional)
//   {"op": "list"}                                              tools/list
// A connect replaces the previous connection. Answers: {"result": ...} or
// {"error": {"code": ..., "message": ..., "data": ...}}; the process ends when stdin closes.
//
// Run with NODE_PATH unset: the SDK is resolved from the folder given as argv[2] (where the test
// installed it), so nothing is installed globally.
import { createRequire } from 'node:module';
import { createInterface } from 'node:readline';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const prefix = process.argv[2];
const require = createRequire(path.join(prefix, 'package.json'));
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);
const { Client } = await load('@modelcontextprotocol/sdk/client/index.js');
const { StdioClientTransport } = await load('@modelcontextprotocol/sdk/client/stdio.js');
const { StreamableHTTPClientTransport } = await load(
  '@modelcontextprotocol/sdk/client/streamableHttp.js'
);

let client = null;

async function connect(command) {
  if (client !== null) {
    await client.close();
  }
  const transport = command.url
    ? new StreamableHTTPClientTransport(new URL(command.url), {
        requestInit: { headers: command.headers ?? {} },
      })
    : new StdioClientTransport({ command: command.command, args: command.args, stderr: 'ignore' });
  client = new Client({ name: 'ts-sdk-real-client', version: '1.0.0' });
  await client.connect(transport);
  return { protocolVersion: transport.protocolVersion ?? null };
}

async function handle(command) {
  switch (command.op) {
    case 'connect':
      return connect(command);
    case 'call': {
      const params = { name: command.name, arguments: command.arguments };
      if (command.meta) {
        params._meta = command.meta;
      }
      return client.callTool(params);
    }
    case 'list':
      return client.listTools();
    default:
      throw new Error(`unknown op ${command.op}`);
  }
}

const lines = createInterface({ input: process.stdin });
for await (const line of lines) {
  let answer;
  try {
    answer = { result: await handle(JSON.parse(line)) };
  } catch (error) {
    answer = {
      error: { code: error.code ?? null, message: String(error.message), data: error.data ?? null },
    };
  }
  process.stdout.write(JSON.stringify(answer) + '\n');
}
if (client !== null) {
  await client.close();
}
