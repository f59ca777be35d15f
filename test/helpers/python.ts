import { join } from "node:path";
import { crc32cLibraryPath } from "../../native/index.ts";
import { CRC32C_LIBRARY_ENV } from "../../sdk/contract/protocol/channel.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
/** The interpreter with torch that the tests run: $MONKEYTREE_PYTHON, else the checkout's .venv (`npm run setup:python`). */
export const PYTHON = process.env.MONKEYTREE_PYTHON ?? join(ROOT, ".venv/bin/python");
/** torchrun of that interpreter. */
export const TORCHRUN = [PYTHON, "-m", "torch.distributed.run"];
/**
 * The hook run from the checkout: its package on PYTHONPATH and, as `monkeytree launch` gives
 * its processes, the addon's CRC32C library (test/python/package.test.ts runs it installed).
 */
export const HOOK_ENV = { PYTHONPATH: join(ROOT, "sdk/python"), [CRC32C_LIBRARY_ENV]: crc32cLibraryPath };
