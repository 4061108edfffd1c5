// The TypeScript SDK's client (npm @modelcontextprotocol/sdk), driven by the Python tests.
//
// Commands arrive one JSON object per line on stdin; one JSON answer per line goes to stdout:
//   {"op": "connect", "command": "...", "args": [...]}          stdio: spawn the server
//   {"op": "connect", "url": "...", "headers": {...}}           streamable HTTP; the headers go
//                                                               on every request (requestInit)
//   {"op": "call", "name": "...", "arguments": {...}, "meta": {...}, "timeoutMs": N}
//                                                               tools/call (meta, timeoutMs
//                                                               optional: past it the SDK gives
//                                                               up, -32001, and sends
//                                                               notifications/cancelled)
//   {"op": "list"}                                              tools/list
// A connect replaces the previous connection. Answers: {"result": ...} or
// {"error": {"code": ..., "message": ..., "data": ...}}; the process ends when stdin closes.
// An answer is written once every message the client sent meanwhile was handed to the server (a
// timed-out call's cancel, which the SDK sends without waiting, included): whatever the next
// command sends reaches the server after it, over HTTP too.
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
// What the transport is still sending (see the header).
const sending = new Set();

function tracked(transport) {
  const send = transport.send.bind(transport);
  transport.send = (message, options) => {
    const sent = send(message, options);
    sending.add(sent);
    sent.then(
      () => sending.delete(sent),
      () => sending.delete(sent)
    );
    return sent;
  };
  return transport;
}

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
  await client.connect(tracked(transport));
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
      const options = command.timeoutMs ? { timeout: command.timeoutMs } : undefined;
      return client.callTool(params, undefined, options);
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
  await Promise.allSettled([...sending]);
  process.stdout.write(JSON.stringify(answer) + '\n');
}
if (client !== null) {
  await client.close();
}
