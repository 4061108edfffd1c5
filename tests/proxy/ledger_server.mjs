// An upstream the proxy did not write: a TypeScript-SDK server (npm @modelcontextprotocol/sdk)
// with an effect ledger, over stdio or streamable HTTP.
//
//   node ledger_server.mjs PREFIX LEDGER_DIR            stdio
//   node ledger_server.mjs PREFIX LEDGER_DIR --port N   streamable HTTP at /mcp (0: any port;
//                                                       the port is printed as "PORT n")
//
// Files in LEDGER_DIR, each appended with one line and fsynced before anything else happens, so
// what the test counts is what happened, whatever the proxy says:
//   calls    one line per tools/call of `charge` received (with the `_meta` key it carried)
//   effects  one line per effect of `charge`
// `charge({amount, crash, wait_ms})`: crash "before" SIGKILLs this process after recording the
// call and before the effect; "after" after the effect and before the answer; "after-once" as
// "after" the first time in LEDGER_DIR only (the marker file `crashed`). `wait_ms` holds the
// answer back after the effect. `consult({ask})` is an effect (a line in calls and in effects)
// that sends its caller a log line (logger "ledger", "consulting #N") and then, by `ask`, a
// sampling, elicitation or roots request, answering with what it got. `pid` and `balance` are
// read-only. The SDK is resolved from PREFIX (installed there by the test).
import { createRequire } from 'node:module';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { pathToFileURL } from 'node:url';

const [prefix, dir, flag, portText] = process.argv.slice(2);
const require = createRequire(path.join(prefix, 'package.json'));
const load = async (name) => import(pathToFileURL(require.resolve(name)).href);
const { McpServer } = await load('@modelcontextprotocol/sdk/server/mcp.js');
const { StdioServerTransport } = await load('@modelcontextprotocol/sdk/server/stdio.js');
const { StreamableHTTPServerTransport } = await load(
  '@modelcontextprotocol/sdk/server/streamableHttp.js'
);
const { z } = await load('zod');

function record(file, line) {
  const fd = fs.openSync(path.join(dir, file), 'a');
  fs.writeSync(fd, line + '\n');
  fs.fsyncSync(fd);
  fs.closeSync(fd);
}

function count(file) {
  try {
    return fs.readFileSync(path.join(dir, file), 'utf8').split('\n').filter(Boolean).length;
  } catch {
    return 0;
  }
}

function build() {
  const server = new McpServer(
    { name: 'ledger', version: '1.0.0' },
    { capabilities: { logging: {} } }
  );
  server.registerTool(
    'charge',
    {
      description: 'Charge an amount (an effect, recorded in the ledger).',
      inputSchema: {
        amount: z.number(),
        crash: z.string().optional(),
        wait_ms: z.number().optional(),
      },
      annotations: { destructiveHint: true, idempotentHint: false },
    },
    async ({ amount, crash, wait_ms }, extra) => {
      const key = extra?._meta?.['io.github.mcp-once/idempotency-key'] ?? '';
      record('calls', JSON.stringify({ amount, key }));
      if (crash === 'before') process.kill(process.pid, 'SIGKILL');
      record('effects', JSON.stringify({ amount, key }));
      if (crash === 'after') process.kill(process.pid, 'SIGKILL');
      if (crash === 'after-once' && !fs.existsSync(path.join(dir, 'crashed'))) {
        record('crashed', 'x');
        process.kill(process.pid, 'SIGKILL');
      }
      if (wait_ms) await new Promise((resolve) => setTimeout(resolve, wait_ms));
      if (amount < 0) {
        return { content: [{ type: 'text', text: 'declined' }], isError: true };
      }
      return { content: [{ type: 'text', text: `charged ${amount} (#${count('effects')})` }] };
    }
  );
  server.registerTool(
    'consult',
    {
      description: 'An effect that asks its caller (a log line, then sampling, elicitation or roots).',
      inputSchema: { ask: z.string() },
      annotations: { destructiveHint: true, idempotentHint: false },
    },
    async ({ ask }, extra) => {
      const key = extra?._meta?.['io.github.mcp-once/idempotency-key'] ?? '';
      record('calls', JSON.stringify({ ask, key }));
      record('effects', JSON.stringify({ ask, key }));
      await extra.sendNotification({
        method: 'notifications/message',
        params: { level: 'info', logger: 'ledger', data: `consulting #${count('effects')}` },
      });
      const related = { relatedRequestId: extra.requestId };
      let answer = 'nothing asked';
      if (ask === 'sampling') {
        const message = { role: 'user', content: { type: 'text', text: 'name a colour' } };
        const got = await server.server.createMessage(
          { messages: [message], maxTokens: 10 },
          related
        );
        answer = got.content.text;
      } else if (ask === 'elicitation') {
        const schema = { type: 'object', properties: { ok: { type: 'boolean' } } };
        const got = await server.server.elicitInput(
          { message: 'approve?', requestedSchema: schema },
          related
        );
        answer = `${got.action} ${JSON.stringify(got.content ?? {})}`;
      } else if (ask === 'roots') {
        const got = await server.server.listRoots(undefined, related);
        answer = got.roots.map((root) => root.uri).join(' ');
      }
      return { content: [{ type: 'text', text: `${ask}: ${answer}` }] };
    }
  );
  server.registerTool(
    'balance',
    {
      description: 'How many effects the ledger holds.',
      inputSchema: {},
      annotations: { readOnlyHint: true },
    },
    async () => ({ content: [{ type: 'text', text: String(count('effects')) }] })
  );
  server.registerTool(
    'pid',
    { description: 'This process id.', inputSchema: {}, annotations: { readOnlyHint: true } },
    async () => ({ content: [{ type: 'text', text: String(process.pid) }] })
  );
  return server;
}

if (flag === '--port') {
  // Stateless: one server and transport per request, as the SDK's stateless example does.
  // A request whose client dies while sending it (a proxy replica SIGKILLed mid-request) rejects
  // the body's read with "aborted": answered (to nobody) and logged, never an unhandled rejection,
  // which would end this process as no server in production ends on a client's death.
  const listener = http.createServer(async (req, res) => {
    let body;
    try {
      const chunks = [];
      for await (const chunk of req) chunks.push(chunk);
      body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString()) : undefined;
    } catch (err) {
      process.stderr.write(`request body not read: ${err.message}\n`);
      if (!res.headersSent) res.writeHead(400);
      res.end();
      return;
    }
    const server = build();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on('close', () => {
      transport.close();
      server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, body);
  });
  listener.listen(Number(portText), '127.0.0.1', () => {
    process.stdout.write(`PORT ${listener.address().port}\n`);
  });
} else {
  await build().connect(new StdioServerTransport());
}
