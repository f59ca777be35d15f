import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { CRC32C_LIBRARY_ENV } from "../../sdk/contract/protocol/channel.ts";
import { canRun, torch } from "../helpers/prerequisites.ts";
import { HOOK_ENV, PYTHON } from "../helpers/python.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

const hasTorch = canRun("test/python/crc.test.ts", torch());

// Every size class: below the vector threshold, odd lengths, several MiB; with a running CRC.
const script = `
import json, torch
from monkeytree import crc
from monkeytree.layout import crc32c as table
out = {"native": crc.native_library() is not None, "agree": True}
gen = torch.Generator().manual_seed(7)
for size in (0, 1, 9, 65535, 65536, 1_000_003, 8 << 20):
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    expected = crc._crc32c_torch(data, 12345) if size > 4096 else table(bytes(data.tolist()), 12345)
    copy = torch.empty_like(data)
    ok = crc.crc32c_tensor(data, 12345) == expected and crc.copy_with_crc32c(copy, data) == crc._crc32c_torch(data) and torch.equal(copy, data)
    out["agree"] = out["agree"] and ok
print(json.dumps(out))
`;

interface Run {
  native: boolean;
  agree: boolean;
  stderr: string;
}

function run(env: Record<string, string | undefined>): Run {
  const result = spawnSync(PYTHON, ["-c", script], { encoding: "utf8", env: { ...process.env, ...HOOK_ENV, ...env } });
  if (result.status !== 0) throw new Error(result.stderr);
  return { ...(JSON.parse(result.stdout) as { native: boolean; agree: boolean }), stderr: result.stderr };
}

// Each test starts Python with torch, one or two times: tens of seconds each on a loaded machine.
describe.skipIf(!hasTorch)("the hook's CRC32C", { timeout: 3 * SAFETY_NET_MS }, () => {
  it("uses the addon's library named by MONKEYTREE_CRC32C_LIB and agrees with the torch and table versions", () => {
    expect(run({})).toEqual({ native: true, agree: true, stderr: "" });
  });

  it("falls back to torch where the variable is unset or names no loadable library, and says so once on stderr", () => {
    const fallback = /^monkeytree: MONKEYTREE_CRC32C_LIB[ =].*; checksums fall back to the torch CRC32C, about 30 times slower\n$/;
    const unset = run({ [CRC32C_LIBRARY_ENV]: undefined });
    expect(unset).toMatchObject({ native: false, agree: true, stderr: expect.stringMatching(fallback) });
    expect(unset.stderr).toContain("MONKEYTREE_CRC32C_LIB is not set (monkeytree launch sets it");
    const missing = run({ [CRC32C_LIBRARY_ENV]: "/nonexistent/monkeytree_crc32c.node" });
    expect(missing).toMatchObject({ native: false, agree: true, stderr: expect.stringMatching(fallback) });
    expect(missing.stderr).toContain("MONKEYTREE_CRC32C_LIB=/nonexistent/monkeytree_crc32c.node cannot be loaded (");
  });
});
