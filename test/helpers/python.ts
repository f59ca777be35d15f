import { spawnSync } from "node:child_process";
import { crc32cLibraryPath } from "../../native/index.ts";
import { CRC32C_LIBRARY_ENV } from "../../sdk/protocol/channel.ts";

/** Debian's python3-torch installs for the system interpreter; `python3` on PATH may be another one. */
export const PYTHON = "/usr/bin/python3";
/**
 * The hook run from the checkout: its package on PYTHONPATH and, as `monkeytree launch` gives
 * its processes, the addon's CRC32C library (test/python/package.test.ts runs it installed).
 */
export const HOOK_ENV = { PYTHONPATH: new URL("../../sdk/python", import.meta.url).pathname, [CRC32C_LIBRARY_ENV]: crc32cLibraryPath };

const probe = spawnSync(PYTHON, ["-c", "import torch"], { encoding: "utf8" });
/** Why the Python tests cannot run here, or null when torch imports. */
export const torchMissing: string | null = probe.status === 0 ? null : `${PYTHON} cannot import torch: ${probe.stderr.trim() || probe.error?.message}`;

/**
 * Whether torch is there. Locally its absence skips the Python tests; in CI, where .ci/run
 * installs python3-torch, it is an error.
 */
export function torchForTests(): boolean {
  if (torchMissing !== null && process.env.CI) throw new Error(`${torchMissing}; .ci/run installs python3-torch`);
  return torchMissing === null;
}
