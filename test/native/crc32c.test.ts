import { describe, expect, it } from "vitest";
import { capabilities, copyWithCrc32c, crc32c } from "../../native/index.ts";

// Bitwise reference straight from the definition, independent of both native implementations.
function referenceCrc32c(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) {
    crc ^= byte;
    for (let bit = 0; bit < 8; bit++) crc = (crc >>> 1) ^ (0x82f63b78 & -(crc & 1));
  }
  return (crc ^ 0xffffffff) >>> 0;
}

function pseudoRandomBytes(length: number, seed: number): Uint8Array {
  const out = new Uint8Array(length);
  let state = seed >>> 0 || 1;
  for (let i = 0; i < length; i++) {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    out[i] = state & 0xff;
  }
  return out;
}

describe("crc32c", () => {
  it("matches the standard check value", () => {
    expect(crc32c(new TextEncoder().encode("123456789"))).toBe(0xe3069283);
    expect(crc32c(new Uint8Array(0))).toBe(0);
  });

  it("agrees with a bitwise reference across the three-lane block boundaries", () => {
    // Three 8 KiB lanes make one 24576-byte block, then 8-byte words and a byte tail: cover each edge.
    for (const length of [1, 7, 8, 9, 24575, 24576, 24577, 3 * 24576 + 13, 100_003]) {
      const bytes = pseudoRandomBytes(length, length);
      expect(crc32c(bytes), `length ${length}`).toBe(referenceCrc32c(bytes));
    }
  });

  it("continues from a seed like one pass over the concatenation", () => {
    const bytes = pseudoRandomBytes(70_001, 9);
    const split = 30_011;
    expect(crc32c(bytes.subarray(split), crc32c(bytes.subarray(0, split)))).toBe(crc32c(bytes));
  });

  it("copyWithCrc32c copies exactly and returns the source's checksum", () => {
    const source = pseudoRandomBytes(1_000_003, 5);
    const destination = new Uint8Array(source.length + 10);
    expect(copyWithCrc32c(destination, source)).toBe(crc32c(source));
    expect(Buffer.from(destination.subarray(0, source.length)).equals(source)).toBe(true);
    expect(destination.subarray(source.length).every((b) => b === 0)).toBe(true);
  });

  it("copyWithCrc32c rejects a short destination and overlapping views", () => {
    const bytes = new Uint8Array(100);
    expect(() => copyWithCrc32c(bytes.subarray(0, 10), bytes.subarray(50, 70))).toThrow(RangeError);
    expect(() => copyWithCrc32c(bytes.subarray(10, 60), bytes.subarray(0, 50))).toThrow(/overlap/);
    expect(() => crc32c([1, 2, 3] as unknown as Uint8Array)).toThrow(TypeError);
  });

  it("reports which implementation this CPU uses", () => {
    expect(["sse4.2", "table"]).toContain(capabilities().crc32c);
  });
});
