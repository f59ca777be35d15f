import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { canRun, torch } from "../helpers/prerequisites.ts";
import { HOOK_PATH, PYTHON } from "../helpers/python.ts";

const hasTorch = canRun("test/python/crc.test.ts", torch());

// Every size class: below the vector threshold, odd lengths, several MiB; with a running CRC.
const script = `
import json, torch
from monkeytree import crc
from monkeytree.layout import crc32c as table
out = {"implementation": crc.IMPLEMENTATION, "agree": True}
gen = torch.Generator().manual_seed(7)
for size in (0, 1, 9, 65535, 65536, 1_000_003, 8 << 20):
    data = torch.randint(0, 256, (size,), dtype=torch.uint8, generator=gen)
    expected = crc._crc32c_torch(data, 12345) if size > 4096 else table(bytes(data.tolist()), 12345)
    copy = torch.empty_like(data)
    ok = crc.crc32c_tensor(data, 12345) == expected and crc.copy_with_crc32c(copy, data) == crc._crc32c_torch(data) and torch.equal(copy, data)
    out["agree"] = out["agree"] and ok
print(json.dumps(out))
`;

function run(env: Record<string, string> = {}): { implementation: string; agree: boolean } {
  const result = spawnSync(PYTHON, ["-c", script], { encoding: "utf8", env: { ...process.env, PYTHONPATH: HOOK_PATH, ...env } });
  if (result.status !== 0) throw new Error(result.stderr);
  return JSON.parse(result.stdout) as { implementation: string; agree: boolean };
}

describe.skipIf(!hasTorch)("the hook's CRC32C", () => {
  it("uses the addon's CRC32C through ctypes and agrees with the torch and table versions", () => {
    expect(run()).toEqual({ implementation: "native", agree: true });
  });

  it("falls back to torch where the addon's library cannot be loaded", () => {
    expect(run({ MONKEYTREE_CRC32C_LIB: "/nonexistent/monkeytree_crc32c.node" })).toEqual({ implementation: "torch", agree: true });
  });
});
