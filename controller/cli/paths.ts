import { join } from "node:path";
import { fileURLToPath } from "node:url";

/** Absolute paths of the package's entry points, for commands that start other processes. */
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
/** The `monkeytree` command. */
export const CLI = join(ROOT, "bin/monkeytree.js");
/** Runs a TypeScript file with the CLI's loader. */
export const RUN_TS = join(ROOT, "bin/run-ts.js");
/** The example training loop's launcher (examples/train/). */
export const WORKER = join(ROOT, "examples/train/worker.ts");
