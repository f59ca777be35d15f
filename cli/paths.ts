import { nodeArgs } from "../sdk/contract/paths.ts";

/** The `monkeytree` command. */
export const CLI = nodeArgs(import.meta.url, "./monkeytree");
/** The demo's training loop and its launcher (cli/demo/). */
export const WORKER = nodeArgs(import.meta.url, "./demo/worker");
