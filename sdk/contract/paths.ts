import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/**
 * The package's root, found through its own name: the same from the sources (sdk/) and the
 * compiled modules (dist/sdk/), in a checkout or in node_modules.
 */
export const PACKAGE_ROOT = dirname(createRequire(import.meta.url).resolve("monkeytree/package.json"));

/** Runs a TypeScript file with tsx's loader; only a checkout has it (see `nodeArgs`). */
export const RUN_TS = join(PACKAGE_ROOT, "bin/run-ts.js");

/**
 * The Node arguments (after `process.execPath`) that run one of this package's modules,
 * named without its extension relative to `caller` (the calling module's `import.meta.url`).
 * A caller running from source (.ts, under tsx or vitest) gets the source through tsx's loader;
 * a compiled one (.js in dist/) gets the compiled module with plain Node. Either way a child
 * (a process, or a worker thread: its file, then its argv) runs the same code as its parent,
 * never a stale build or a loader it does not have.
 */
export function nodeArgs(caller: string, module: string): string[] {
  const source = caller.endsWith(".ts");
  const file = fileURLToPath(new URL(`${module}${source ? ".ts" : ".js"}`, caller));
  return source ? [RUN_TS, file] : [file];
}
