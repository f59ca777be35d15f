import { spawnSync } from "node:child_process";

/** Debian's python3-torch installs for the system interpreter; `python3` on PATH may be another one. */
export const PYTHON = "/usr/bin/python3";
/** Where the hook's package lives, for PYTHONPATH. */
export const HOOK_PATH = new URL("../../sdk/python", import.meta.url).pathname;

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
