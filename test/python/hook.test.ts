import { spawnSync } from "node:child_process";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { randomFillSync } from "node:crypto";
import { StagingBuffer, crc32c } from "../../native/index.ts";
import { checkpointCapacity, packCheckpoint, readCheckpoint, type CheckpointItemInput } from "../../sdk/contract/checkpoint/index.ts";
import { canRun, torch } from "../helpers/prerequisites.ts";
import { HOOK_ENV, PYTHON } from "../helpers/python.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

const worker = new URL("./fixtures/worker.py", import.meta.url).pathname;
const hasTorch = canRun("test/python/hook.test.ts", torch());

interface Run {
  status: number | null;
  output: Record<string, unknown>;
}

function python(mode: string, name: string, ...args: string[]): Run {
  const run = spawnSync(PYTHON, [worker, mode, name, ...args], {
    encoding: "utf8",
    env: { ...process.env, ...HOOK_ENV, PYTHONDONTWRITEBYTECODE: "1" },
  });
  if (run.status !== 0 && run.status !== 3) throw new Error(`worker.py ${mode} failed (${run.status}): ${run.stderr}`);
  return { status: run.status, output: JSON.parse(run.stdout) as Record<string, unknown> };
}

const buffers: StagingBuffer[] = [];
function staging(size: number): StagingBuffer {
  const buffer = StagingBuffer.create({ size, lock: false });
  buffers.push(buffer);
  return buffer;
}
afterEach(() => {
  for (const buffer of buffers.splice(0)) buffer.free();
});

const float32 = (values: number[]): Uint8Array => new Uint8Array(Float32Array.from(values).buffer);

// Each test and hook starts Python with torch: tens of seconds on a loaded machine.
describe.skipIf(!hasTorch)(`the Python hook's DCP storage in a staging buffer (needs torch for ${PYTHON})`, { timeout: SAFETY_NET_MS }, () => {
  // One Python save (model, Adam state, step, RNG state) shared by the tests that only read it.
  let saved: StagingBuffer;
  let output: Record<string, unknown>;
  beforeAll(() => {
    saved = StagingBuffer.create({ size: 1 << 20, lock: false });
    output = python("save", saved.name).output;
  }, SAFETY_NET_MS);
  afterAll(() => saved.free());

  function copyOfSaved(): StagingBuffer {
    const buffer = staging(saved.size);
    buffer.bytes().set(saved.bytes());
    return buffer;
  }

  it("Python saves model, Adam state, step and RNG state; the TypeScript reader verifies every checksum", () => {
    const view = readCheckpoint(saved.bytes());
    expect(view.length).toBe(output.length);
    expect(view.metadata.items.map((item) => item.fqn)).toEqual(output.fqns);
    expect(Array.from(view.chunks("model.2.bias")[0]?.data ?? [])).toEqual(output.bias);
    expect(view.metadata.items.find((item) => item.fqn === "model.0.weight")).toMatchObject({
      kind: "tensor",
      dtype: "float32",
      size: [16, 8],
      chunks: [{ offsets: [0, 0], sizes: [16, 8], length: 16 * 8 * 4 }],
    });
    expect(view.metadata.items.find((item) => item.fqn === "optim.state.0.step")).toMatchObject({ kind: "tensor", size: [] });
    // A bytes value is stored verbatim; other values (an int, a list of dicts) as torch.save pickles.
    expect(Buffer.from(view.bytes("rng")).toString("hex")).toBe(output.rng);
    for (const fqn of ["step", "optim.param_groups"]) expect(view.bytes(fqn).byteLength).toBeGreaterThan(0);
  });

  it("the Python StorageReader loads a checkpoint the TypeScript writer packed, chunk by chunk", () => {
    const items: CheckpointItemInput[] = [
      {
        fqn: "w",
        kind: "tensor",
        dtype: "float32",
        size: [2, 3],
        chunks: [
          { offsets: [1, 0], sizes: [1, 3], data: float32([4, 5, 6]) },
          { offsets: [0, 0], sizes: [1, 3], data: float32([1, 2, 3]) },
        ],
      },
      { fqn: "note", kind: "bytes", data: new TextEncoder().encode("written by TypeScript") },
      { fqn: "ids", kind: "tensor", dtype: "int64", chunks: [{ sizes: [3], data: new Uint8Array(BigInt64Array.from([7n, -1n, 2n ** 40n]).buffer) }] },
      // bfloat16 is the top half of a float32: 1.5, -2, 0.25, 3
      { fqn: "half", kind: "tensor", dtype: "bfloat16", chunks: [{ sizes: [4], data: Uint8Array.from([0xc0, 0x3f, 0x00, 0xc0, 0x80, 0x3e, 0x40, 0x40]) }] },
      { fqn: "scalar", kind: "tensor", dtype: "float64", size: [], chunks: [{ sizes: [], data: new Uint8Array(Float64Array.from([0.1]).buffer) }] },
    ];
    const buffer = staging(checkpointCapacity(items, { alignment: 128 }));
    packCheckpoint(buffer.bytes(), items, { alignment: 128 });
    expect(python("load-ts", buffer.name).output).toEqual({
      w: [
        [1, 2, 3],
        [4, 5, 6],
      ],
      ids: [7, -1, 2 ** 40],
      half: [1.5, -2, 0.25, 3],
      scalar: 0.1,
      note: "written by TypeScript",
    });
  });

  it("a Python round trip restores identical tensors and RNG state, and the next step matches", () => {
    const buffer = staging(1 << 20);
    expect(python("roundtrip", buffer.name).output).toEqual({
      tensors: 16,
      identical: 16,
      step: 3,
      rngEqual: true,
      groupsEqual: true,
      nextStepEqual: true,
    });
  });

  it("the Python CRC32C (vectorised with torch, and by table) agrees with the native one", () => {
    const length = 3 * 2 ** 20 + 12_345;
    const buffer = staging(length);
    randomFillSync(buffer.bytes());
    expect(python("crc", buffer.name, String(length)).output).toEqual({
      vector: crc32c(buffer.bytes(0, length)),
      table: crc32c(buffer.bytes(0, 70_001)),
    });
  });

  it("the Python reader rejects a checkpoint with one corrupted byte, naming the item", () => {
    const buffer = copyOfSaved();
    const chunk = readCheckpoint(buffer.bytes()).metadata.items.find((item) => item.fqn === "optim.state.1.exp_avg");
    if (chunk?.kind !== "tensor") throw new Error("the saved checkpoint lacks optim.state.1.exp_avg");
    const bytes = buffer.bytes();
    const at = (chunk.chunks[0]?.storageOffset ?? 0) + 5;
    bytes[at] = (bytes[at] ?? 0) ^ 0x01;
    const { status, output } = python("load", buffer.name);
    expect(status).toBe(3);
    expect(output.code).toBe("checksum_mismatch");
    expect(output.message).toMatch(
      /^optim\.state\.1\.exp_avg chunks\[0\]: CRC32C of bytes \[\d+, \d+\) is 0x[0-9a-f]{8}, metadata says 0x[0-9a-f]{8}; the checkpoint is corrupt$/,
    );
  });

  it("the Python reader rejects a corrupted header before reading any item", () => {
    const buffer = copyOfSaved();
    const bytes = buffer.bytes();
    bytes[20] = (bytes[20] ?? 0) ^ 0x80;
    const { status, output } = python("load", buffer.name);
    expect(status).toBe(3);
    expect(output).toMatchObject({ code: "checksum_mismatch", message: expect.stringMatching(/^header CRC32C is/) });
  });
});
