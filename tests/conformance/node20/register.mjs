// Node 20 shim for @modelcontextprotocol/conformance 0.1.14+ and 0.2.0 alphas, whose bundled
// dist/index.js does `import { globSync } from 'fs'` at the top (fs.globSync is Node 22+): on
// Node 20 the named import fails when the module is linked, before any command runs.
// Preloaded with `node --import ./register.mjs`; on Node 22+ it does nothing.
// The server runs never call globSync (only `tier-check` does); fs.mjs still implements the
// `**/name` patterns that command uses, rather than throwing.
import fs from 'node:fs';
import { register } from 'node:module';

if (typeof fs.globSync !== 'function') {
  register('./hooks.mjs', import.meta.url);
}
