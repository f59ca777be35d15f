import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { StagingBuffer, TransferError, removeStaleStagingBuffers } from "../../native/index.ts";

const PAGE = 4096;
const pythonFixture = new URL("./fixtures/shm_range.py", import.meta.url).pathname;
const hasPython = spawnSync("python3", ["--version"]).status === 0;

const live: StagingBuffer[] = [];
function create(size: number, name?: string): StagingBuffer {
  const buffer = StagingBuffer.create({ size, lock: false, ...(name ? { name } : {}) });
  live.push(buffer);
  return buffer;
}
afterEach(() => {
  for (const buffer of live.splice(0)) buffer.free();
});

function python(...args: string[]): string {
  const run = spawnSync("python3", [pythonFixture, ...args], { encoding: "utf8" });
  if (run.status !== 0) throw new Error(`python3 failed: ${run.stderr}`);
  return run.stdout.trim();
}

describe("StagingBuffer", () => {
  it("is page-sized, zeroed, backed by a /dev/shm file, and removes it on free", () => {
    const buffer = create(10_000);
    expect(buffer.size).toBe(3 * PAGE);
    expect(buffer.path).toBe(`/dev/shm/${buffer.name}`);
    expect(existsSync(buffer.path)).toBe(true);
    expect(buffer.bytes().every((b) => b === 0)).toBe(true);
    live.pop();
    buffer.free();
    expect(buffer.freed).toBe(true);
    expect(existsSync(buffer.path)).toBe(false);
    buffer.free(); // idempotent
  });

  it("reports whether mlock worked, with the reason when it did not", () => {
    const buffer = StagingBuffer.create({ size: PAGE, lock: true });
    live.push(buffer);
    if (buffer.locked) expect(buffer.lockError).toBeNull();
    else expect(buffer.lockError).toMatch(/mlock/);
    expect(create(PAGE).lockError).toBe("not requested");
  });

  it("shares bytes with a second mapping of the same name", () => {
    const owner = create(2 * PAGE);
    const other = StagingBuffer.open(owner.name, { lock: false });
    owner.bytes(100, 3).set([1, 2, 3]);
    expect([...other.bytes(100, 3)]).toEqual([1, 2, 3]);
    other.free();
    expect(existsSync(owner.path)).toBe(true); // only the creator removes the file
  });

  it("detaches views on free and throws buffer_freed on every later use", () => {
    const buffer = create(PAGE);
    const view = buffer.bytes();
    live.pop();
    buffer.free();
    expect(view.byteLength).toBe(0);
    for (const use of [() => buffer.bytes(), () => buffer.crc32c(0, 1)]) {
      expect(use).toThrow(TransferError);
      try {
        use();
      } catch (error) {
        expect((error as TransferError).code).toBe("buffer_freed");
        expect((error as Error).message).toMatch(/was freed; allocate a new one/);
      }
    }
  });

  it("rejects bad options naming the option", () => {
    expect(() => StagingBuffer.create({ size: 0 })).toThrow(/size must be between 1/);
    expect(() => StagingBuffer.create({ size: 1.5 })).toThrow(TypeError);
    expect(() => StagingBuffer.create({ size: PAGE, name: "a/b" })).toThrow(/name must match/);
    const buffer = create(PAGE);
    expect(() => buffer.bytes(PAGE - 1, 2)).toThrow(RangeError);
    expect(() => buffer.bytes(-1, 1)).toThrow(/bytes.offset/);
  });

  it("refuses a name that already exists, and opening a missing one, with code shm_failed", () => {
    const buffer = create(PAGE);
    expect(() => StagingBuffer.create({ size: PAGE, name: buffer.name })).toThrow(/EEXIST/);
    try {
      StagingBuffer.open(`${buffer.name}-missing`);
      expect.unreachable();
    } catch (error) {
      expect((error as TransferError).code).toBe("shm_failed");
      expect((error as Error).message).toMatch(/ENOENT/);
    }
  });

  it("creates a buffer off the event loop as create() does, rejecting what create() refuses", async () => {
    const buffer = await StagingBuffer.createAsync({ size: PAGE + 1, lock: false });
    live.push(buffer);
    expect({ size: buffer.size, file: existsSync(buffer.path), zeroed: buffer.bytes().every((b) => b === 0) }).toEqual({
      size: 2 * PAGE,
      file: true,
      zeroed: true,
    });
    buffer.bytes().set([1, 2, 3]);
    const again = StagingBuffer.open(buffer.name, { lock: false });
    expect([...again.bytes(0, 3)]).toEqual([1, 2, 3]);
    again.free();
    await expect(StagingBuffer.createAsync({ size: PAGE, name: buffer.name })).rejects.toMatchObject({
      code: "shm_failed",
      message: expect.stringMatching(/EEXIST/),
    });
    await expect(StagingBuffer.createAsync({ size: 0 })).rejects.toThrow(/size/);
  });

  it("removes generated buffers whose creator died, and nothing else", () => {
    const directory = mkdtempSync(join(tmpdir(), "mt-shm-"));
    try {
      const dead = spawnSync(process.execPath, ["-e", "0"]).pid ?? 0;
      const names = [
        `monkeytree-${dead}-0123456789ab`, // creator gone: stale
        `monkeytree-${process.pid}-0123456789ab`, // creator alive
        `monkeytree-${dead}-checkpoint`, // chosen by a caller, not generated
        "other-file",
      ];
      for (const name of names) writeFileSync(join(directory, name), "");
      expect(removeStaleStagingBuffers(directory)).toEqual([names[0]]);
      expect(readdirSync(directory).sort()).toEqual(names.slice(1).sort());
    } finally {
      rmSync(directory, { recursive: true, force: true });
    }
  });

  describe.skipIf(!hasPython)("with a Python process (stdlib mmap)", () => {
    it("Python reads the bytes this process wrote, without a copy", () => {
      const buffer = create(64 * 1024);
      const view = buffer.bytes(1000, 50_000);
      for (let i = 0; i < view.length; i++) view[i] = (i * 131 + 7) & 0xff;
      const expected = createHash("sha256").update(view).digest("hex");
      expect(python("sha256", buffer.name, "1000", "50000")).toBe(expected);
    });

    it("this process sees bytes Python wrote into the same mapping", () => {
      const buffer = create(PAGE);
      python("fill", buffer.name, "10", "300", "5");
      const view = buffer.bytes(10, 300);
      expect([...view].every((b, i) => b === (5 + i * 31) % 251)).toBe(true);
    });
  });
});
