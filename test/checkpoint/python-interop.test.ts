import { spawnSync } from "node:child_process";
import { describe, expect, it } from "vitest";
import { StagingBuffer } from "../../native/index.ts";
import { checkpointCapacity, packCheckpoint, readCheckpoint, type CheckpointItemInput } from "../../sdk/contract/checkpoint/index.ts";

const fixture = new URL("./fixtures/dcp_layout.py", import.meta.url).pathname;
const hasPython = spawnSync("python3", ["--version"]).status === 0;

function python(args: string[], input?: string): unknown {
  const run = spawnSync("python3", [fixture, ...args], { encoding: "utf8", ...(input === undefined ? {} : { input }) });
  if (run.status !== 0) throw new Error(`python3 ${args.join(" ")} failed: ${run.stderr}`);
  return JSON.parse(run.stdout);
}

const hex = (bytes: Uint8Array): string => Buffer.from(bytes).toString("hex");

function pattern(length: number, seed: number): Uint8Array {
  return Uint8Array.from({ length }, (_, i) => (seed * 13 + i * 7) & 0xff);
}

describe.skipIf(!hasPython)("checkpoint bytes shared with a stdlib Python implementation of FORMAT.md", () => {
  it("Python reads a checkpoint the TypeScript writer packed into a staging buffer", () => {
    const items: CheckpointItemInput[] = [
      { fqn: "w", kind: "tensor", dtype: "float16", size: [6, 4], chunks: [{ offsets: [2, 0], sizes: [3, 4], data: pattern(24, 1) }] },
      { fqn: "rng", kind: "bytes", data: pattern(13, 2) },
      { fqn: "b", kind: "tensor", dtype: "int32", chunks: [{ sizes: [5], data: pattern(20, 3) }] },
    ];
    const buffer = StagingBuffer.create({ size: checkpointCapacity(items, { alignment: 128 }), lock: false });
    try {
      const { length } = packCheckpoint(buffer.bytes(), items, { alignment: 128 });
      expect(python(["read", buffer.name])).toEqual({
        length,
        items: [
          { fqn: "w", kind: "tensor", dtype: "float16", size: [6, 4], chunks: [{ offsets: [2, 0], sizes: [3, 4], hex: hex(pattern(24, 1)) }] },
          { fqn: "rng", kind: "bytes", hex: hex(pattern(13, 2)) },
          { fqn: "b", kind: "tensor", dtype: "int32", size: [5], chunks: [{ offsets: [0], sizes: [5], hex: hex(pattern(20, 3)) }] },
        ],
      });
    } finally {
      buffer.free();
    }
  });

  it("the TypeScript reader reads a checkpoint Python wrote into a staging buffer", () => {
    const spec = {
      alignment: 16,
      items: [
        { fqn: "layer.bias", kind: "tensor", dtype: "bfloat16", size: [4], chunks: [{ offsets: [0], sizes: [4], hex: hex(pattern(8, 9)) }] },
        { fqn: "meta", kind: "bytes", hex: hex(new TextEncoder().encode('{"step": 7}')) },
      ],
    };
    const buffer = StagingBuffer.create({ size: 4096, lock: false });
    try {
      const { length } = python(["write", buffer.name], JSON.stringify(spec)) as { length: number };
      const view = readCheckpoint(buffer.bytes());
      expect(view.length).toBe(length);
      expect(hex(view.chunks("layer.bias")[0]?.data ?? new Uint8Array())).toBe(hex(pattern(8, 9)));
      expect(new TextDecoder().decode(view.bytes("meta"))).toBe('{"step": 7}');
    } finally {
      buffer.free();
    }
  });
});
