// Resolve hook: `fs` / `node:fs` imported by anything but the shim itself become ./fs.mjs.
const SHIM = new URL('./fs.mjs', import.meta.url).href;

export async function resolve(specifier, context, nextResolve) {
  if ((specifier === 'fs' || specifier === 'node:fs') && context.parentURL !== SHIM) {
    return { url: SHIM, shortCircuit: true };
  }
  return nextResolve(specifier, context);
}
