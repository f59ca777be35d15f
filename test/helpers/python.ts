import { crc32cLibraryPath } from "../../native/index.ts";
import { CRC32C_LIBRARY_ENV } from "../../sdk/protocol/channel.ts";

/** Debian's python3-torch installs for the system interpreter; `python3` on PATH may be another one. */
export const PYTHON = "/usr/bin/python3";
/**
 * The hook run from the checkout: its package on PYTHONPATH and, as `monkeytree launch` gives
 * its processes, the addon's CRC32C library (test/python/package.test.ts runs it installed).
 */
export const HOOK_ENV = { PYTHONPATH: new URL("../../sdk/python", import.meta.url).pathname, [CRC32C_LIBRARY_ENV]: crc32cLibraryPath };

