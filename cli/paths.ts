import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** Absolute paths of the package's entry points, for commands that start other processes. */
const ROOT = fileURLToPath(new URL("../", import.meta.url));
/** The `monkeytree` command. */
export const CLI = join(ROOT, "bin/monkeytree.js");
/** Runs a TypeScript file with the CLI's loader. */
export const RUN_TS = join(ROOT, "bin/run-ts.js");
/** The demo's training loop and its launcher (cli/demo/). */
export const WORKER = join(ROOT, "cli/demo/worker.ts");
