/** Debian's python3-torch installs for the system interpreter; `python3` on PATH may be another one. */
export const PYTHON = "/usr/bin/python3";
/** Where the hook's package lives, for PYTHONPATH. */
export const HOOK_PATH = new URL("../../sdk/python", import.meta.url).pathname;
