import { spawn } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StagingBuffer } from "../../native/index.ts";
import { checkpointCapacity, packCheckpoint, readCheckpoint, type CheckpointItemInput } from "../../sdk/contract/checkpoint/index.ts";
import { runCli } from "../helpers/cli.ts";
import { localRendezvous } from "../helpers/net.ts";
import { canRun, torch } from "../helpers/prerequisites.ts";
import { HOOK_ENV, PYTHON, TORCHRUN } from "../helpers/python.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

const ROOT = new URL("../../", import.meta.url).pathname;
const fsdp = new URL("./fixtures/fsdp.py", import.meta.url).pathname;
const compare = new URL("./fixtures/dcp_compare.py", import.meta.url).pathname;
const hasTorch = canRun("test/python/export.test.ts", torch());

/** Each rank's range of the shared staging buffer, as `monkeytree launch --checkpoint-bytes 2 MiB` would cut it for two processes. */
const SHARE = 1 << 20;
// The CLI finds the interpreter through $MONKEYTREE_PYTHON, as a user's shell would give it.
const ENV = { ...process.env, ...HOOK_ENV, MONKEYTREE_PYTHON: PYTHON, OMP_NUM_THREADS: "1", PYTHONDONTWRITEBYTECODE: "1" };

interface Ran {
  code: number | null;
  stdout: string;
  stderr: string;
}

function run(program: string, args: string[]): Promise<Ran> {
  return new Promise((resolve, reject) => {
    const child = spawn(program, args, { cwd: ROOT, env: ENV, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}

/** The real CLI as a process: `monkeytree checkpoint export ARGS`. */
const exportCli = (...args: string[]) => run(process.execPath, ["bin/run-ts.js", "cli/monkeytree.ts", "checkpoint", "export", ...args]);

/** The stderr lines that are not the hook's note about a missing native CRC32C library. */
const errorLines = (stderr: string) => stderr.split("\n").filter((line) => line !== "" && !line.includes("checksums fall back"));

const float32 = (values: number[]): Uint8Array => new Uint8Array(Float32Array.from(values).buffer);

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "monkeytree-export-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A checkpoint packed by the TypeScript writer into a file of its own. */
function packedFile(name: string, items: CheckpointItemInput[]): string {
  const bytes = new Uint8Array(checkpointCapacity(items));
  const { length } = packCheckpoint(bytes, items);
  const path = join(dir, name);
  writeFileSync(path, bytes.subarray(0, length));
  return path;
}

/** Whether an export left anything besides `keep` in `parent`: a half-written directory, say. */
const leftovers = (parent: string, keep: string[]) => readdirSync(parent).filter((name) => !keep.includes(name));

describe("`monkeytree checkpoint export` usage", () => {
  it("needs a source and --out, and says so in one line before starting Python", async () => {
    expect(await runCli("checkpoint", "export", "--out", join(dir, "x"))).toEqual({
      code: 2,
      stdout: "",
      stderr:
        "monkeytree checkpoint: give the staged checkpoint with --buffer NAME (a staging buffer in /dev/shm) or --file PATH (a copy of one)\nRun `monkeytree checkpoint --help` for usage.\n",
    });
    const missing = await runCli("checkpoint", "export", "--buffer", "monkeytree-no-such-buffer", "--out", join(dir, "x"));
    expect(missing).toEqual({
      code: 2,
      stdout: "",
      stderr:
        "monkeytree checkpoint: --buffer monkeytree-no-such-buffer: /dev/shm/monkeytree-no-such-buffer does not exist; `ls /dev/shm` lists the staging buffers\n",
    });
    expect((await runCli("checkpoint", "export", "--file", fsdp, "--ranges", "0", "--out", join(dir, "x"))).stderr).toMatch(
      /^monkeytree checkpoint: --ranges must be a whole number ≥ 1, got "0"\n/,
    );
    expect((await runCli("checkpoint")).code).toBe(2);
    expect((await runCli("checkpoint", "--help")).stdout).toMatch(/^usage: monkeytree checkpoint export \[--buffer NAME\]\.\.\. \[--file PATH\]\.\.\./);
    expect(existsSync(join(dir, "x"))).toBe(false);
  });

  it("names --python and the fix when the interpreter cannot be started", async () => {
    const packed = packedFile("usage.ckpt", [{ fqn: "b", kind: "bytes", data: new Uint8Array([1]) }]);
    const result = await runCli("checkpoint", "export", "--file", packed, "--out", join(dir, "x"), "--python", join(dir, "no-python"));
    expect(result.code).toBe(2);
    expect(result.stderr).toBe(
      `monkeytree checkpoint: --python ${join(dir, "no-python")} cannot be started (no such file): give --python PATH to an interpreter with torch and the monkeytree package, or set $MONKEYTREE_PYTHON\n`,
    );
  });
});

// Each test starts Python with torch (the first one torchrun with two processes): tens of seconds on a loaded machine.
describe.skipIf(!hasTorch)(`a staged FSDP2 checkpoint as a standard DCP checkpoint (needs torch for ${PYTHON})`, { timeout: SAFETY_NET_MS }, () => {
  let buffer: StagingBuffer;
  let ranks: { rank: number; length: number; fqns: string[]; sharded: string[]; differing: string[]; step: number; localShapes: Record<string, number[]> }[];
  const reference = () => join(dir, "reference.pt");

  beforeAll(async () => {
    buffer = StagingBuffer.create({ size: 2 * SHARE, lock: false });
    const ran = await run(TORCHRUN[0]!, [
      ...TORCHRUN.slice(1),
      "--nproc_per_node",
      "2",
      ...(await localRendezvous()),
      fsdp,
      "save",
      buffer.name,
      String(SHARE),
      reference(),
    ]);
    if (ran.code !== 0) throw new Error(`torchrun fsdp.py save failed (${ran.code}): ${ran.stderr}`);
    ranks = ran.stdout
      .trim()
      .split("\n")
      .map((line) => JSON.parse(line) as (typeof ranks)[number])
      .sort((a, b) => a.rank - b.rank);
  }, SAFETY_NET_MS);
  afterAll(() => buffer?.free());

  it("plain dcp.save and dcp.load with StagingWriter and StagingReader restore every FSDP2 shard and AdamW state bit for bit", () => {
    expect(ranks.map((r) => r.rank)).toEqual([0, 1]);
    for (const rank of ranks) {
      expect(rank.differing).toEqual([]);
      expect(rank.step).toBe(1);
      expect(rank.sharded).toEqual(expect.arrayContaining(["model.0.weight", "model.4.bias", "optim.state.2.weight.exp_avg", "optim.state.4.bias.exp_avg_sq"]));
      expect(rank.fqns).toEqual(expect.arrayContaining(["optim.state.0.weight.step", "rng"]));
    }
    // Five rows over two ranks: 3 and 2, stored with their global offsets.
    expect([ranks[0]!.localShapes["model.2.weight"], ranks[1]!.localShapes["model.2.weight"]]).toEqual([
      [3, 16],
      [2, 16],
    ]);
    const chunksOf = (rank: number) => {
      const item = readCheckpoint(buffer.bytes(rank * SHARE, SHARE)).metadata.items.find((i) => i.fqn === "model.2.weight");
      return item?.kind === "tensor" ? { size: item.size, chunks: item.chunks.map((c) => ({ offsets: c.offsets, sizes: c.sizes })) } : null;
    };
    expect(chunksOf(0)).toEqual({ size: [5, 16], chunks: [{ offsets: [0, 0], sizes: [3, 16] }] });
    expect(chunksOf(1)).toEqual({ size: [5, 16], chunks: [{ offsets: [3, 0], sizes: [2, 16] }] });
  });

  it("`checkpoint export` merges both ranks' ranges into one directory that FileSystemReader loads into the full tensors", async () => {
    const out = join(dir, "exported");
    const ran = await exportCli("--buffer", buffer.name, "--ranges", "2", "--out", out, "--json");
    expect(errorLines(ran.stderr)).toEqual([]);
    expect(ran.code).toBe(0);
    const result = JSON.parse(ran.stdout) as Record<string, unknown>;
    expect(result).toMatchObject({
      directory: out,
      files: ["__0_0.distcp", "__1_0.distcp", ".metadata"],
      sources: 2,
      // model (6) and AdamW (6 × 3) tensors, each rank's RNG state under its own name and rank 0's as "rng".
      tensors: 27,
      perSource: { rng: ["monkeytree.source0.rng", "monkeytree.source1.rng"] },
      incomplete: [],
      wrapped: [],
    });
    // The scalar steps and the param_groups entries, the same on both ranks, are written once.
    expect(result.duplicates).toBe(6 + (result.bytesItems as number));
    const read = await run(PYTHON, [fsdp, "read", out, reference()]);
    if (read.code !== 0) throw new Error(`fsdp.py read failed (${read.code}): ${read.stderr}`);
    const loaded = JSON.parse(read.stdout) as { fqns: string[]; differing: string[]; step: number; files: string[] };
    expect(loaded.fqns).toEqual(expect.arrayContaining(["model.0.weight", "optim.state.4.bias.exp_avg", "rng", "monkeytree.source1.rng"]));
    expect(loaded.fqns.length).toBe(27);
    expect(loaded.differing).toEqual([]);
    expect(loaded.step).toBe(1);
    expect(leftovers(dir, ["exported", "reference.pt", "usage.ckpt"])).toEqual([]);
  });

  it("an export of one source holds the same files and metadata as FileSystemWriter writes for that state", async () => {
    const work = join(dir, "compare");
    mkdirSync(work);
    const ran = await run(PYTHON, [compare, work]);
    if (ran.code !== 0) throw new Error(`dcp_compare.py failed (${ran.code}): ${ran.stderr}`);
    expect(JSON.parse(ran.stdout)).toMatchObject({
      files: [".metadata", "__0_0.distcp"],
      sameDataFiles: true,
      sameStateDictMetadata: true,
      sameStorageData: true,
      samePlannerData: true,
      version: ["1.0.0", "1.0.0"],
      metadataType: "torch.distributed.checkpoint.metadata.Metadata",
      loadedSame: true,
      result: { sources: 1, tensors: 5, bytesItems: 2, wrapped: ["raw"] },
      raw: "b'\\x00\\x01not a pickle'",
    });
  });

  it("refuses a buffer that holds no checkpoint, a corrupt blob and a non-empty --out in one line each, writing nothing", async () => {
    const parent = join(dir, "bad");
    mkdirSync(parent);
    const noise = join(parent, "noise.bin");
    writeFileSync(noise, new Uint8Array(8192).fill(7));
    const notCheckpoint = await exportCli("--file", noise, "--out", join(parent, "out"));
    expect(notCheckpoint.code).toBe(2);
    expect(errorLines(notCheckpoint.stderr)).toEqual([
      expect.stringMatching(new RegExp(`^monkeytree checkpoint: ${noise}: not a MonkeyTree checkpoint: magic b'(\\\\x07){8}', expected b'MTCKPT01'$`)),
    ]);

    // A copy of the staging buffer with one flipped bit in rank 1's model.0.weight.
    const corrupt = join(parent, "staging.bin");
    const copy = Uint8Array.from(buffer.bytes());
    const item = readCheckpoint(copy.subarray(SHARE)).metadata.items.find((i) => i.fqn === "model.0.weight");
    if (item?.kind !== "tensor") throw new Error("rank 1's checkpoint lacks model.0.weight");
    copy[SHARE + item.chunks[0]!.storageOffset + 3]! ^= 0x10;
    writeFileSync(corrupt, copy);
    const damaged = await exportCli("--file", corrupt, "--ranges", "2", "--out", join(parent, "out"));
    expect(damaged.code).toBe(2);
    expect(errorLines(damaged.stderr)).toEqual([
      expect.stringMatching(
        new RegExp(
          `^monkeytree checkpoint: range 1 of ${corrupt} \\[${SHARE}, ${2 * SHARE}\\): model\\.0\\.weight chunks\\[0\\]: CRC32C of bytes \\[\\d+, \\d+\\) is 0x[0-9a-f]{8}, metadata says 0x[0-9a-f]{8}; the checkpoint is corrupt$`,
        ),
      ),
    ]);

    const full = join(parent, "full");
    mkdirSync(full);
    writeFileSync(join(full, "keep.txt"), "mine");
    const occupied = await exportCli("--buffer", buffer.name, "--ranges", "2", "--out", full);
    expect(occupied).toMatchObject({ code: 2, stdout: "" });
    expect(errorLines(occupied.stderr)).toEqual([
      `monkeytree checkpoint: --out ${full}: it exists and is not empty; give a new or empty directory, or add --overwrite to replace it`,
    ]);
    // The Python exporter refuses too, when called without the CLI's check.
    const direct = await run(PYTHON, ["-m", "monkeytree", "export", "--buffer", buffer.name, "--ranges", "2", "--out", full]);
    expect(direct.code).toBe(2);
    expect(errorLines(direct.stderr)).toEqual([
      `python3 -m monkeytree export: ${full} exists and is not empty; give a new or empty directory, or overwrite it (overwrite=True, --overwrite)`,
    ]);
    expect(readdirSync(full)).toEqual(["keep.txt"]);
    expect(leftovers(parent, ["noise.bin", "staging.bin", "full"])).toEqual([]);

    const replaced = await exportCli("--buffer", buffer.name, "--ranges", "2", "--out", full, "--overwrite");
    expect(replaced.code).toBe(0);
    expect(replaced.stdout).toMatch(
      new RegExp(`^wrote ${full}: 40 items \\(27 tensors in 45 chunks, 13 bytes items\\) from 2 staged checkpoints, \\d+ bytes in 2 data files\\n`),
    );
    expect(readdirSync(full).sort()).toEqual([".metadata", "__0_0.distcp", "__1_0.distcp"]);
    expect(leftovers(parent, ["noise.bin", "staging.bin", "full"])).toEqual([]);
  });

  it("refuses sources that disagree on a chunk or a bytes item, naming the fqn, unless the item is per source", async () => {
    const parent = join(dir, "disagree");
    mkdirSync(parent);
    const w = (values: number[], offset = 0) => ({
      fqn: "w",
      kind: "tensor" as const,
      dtype: "float32" as const,
      size: [4],
      chunks: [{ offsets: [offset], sizes: [values.length], data: float32(values) }],
    });
    const note = (text: string) => ({ fqn: "note", kind: "bytes" as const, data: new TextEncoder().encode(text) });
    const a = packedFile("a.ckpt", [w([1, 2]), note("first")]);
    const conflicting = packedFile("b.ckpt", [w([1, 5]), note("first")]);
    const overlapping = packedFile("c.ckpt", [w([2, 3], 1), note("first")]);
    const otherNote = packedFile("d.ckpt", [w([3, 4], 2), note("second")]);
    const out = join(parent, "out");

    const chunk = await exportCli("--file", a, "--file", conflicting, "--out", out);
    expect(chunk.code).toBe(2);
    expect(errorLines(chunk.stderr)).toEqual([
      `monkeytree checkpoint: w: ${a} and ${conflicting} hold different chunk at offsets [0] of sizes [2]; if it is per-process state, export it per source (per_source pattern, --per-source w)`,
    ]);
    const overlap = await exportCli("--file", a, "--file", overlapping, "--out", out);
    expect(errorLines(overlap.stderr)).toEqual([
      `monkeytree checkpoint: w: the chunk at offsets [1] of sizes [2] in ${overlapping} overlaps the one at offsets [0] of sizes [2] in ${a}`,
    ]);
    const bytes = await exportCli("--file", a, "--file", otherNote, "--out", out);
    expect(errorLines(bytes.stderr)).toEqual([
      `monkeytree checkpoint: note: ${a} and ${otherNote} hold different bytes; if it is per-process state, export it per source (per_source pattern, --per-source note)`,
    ]);
    expect(existsSync(out)).toBe(false);

    const perSource = await exportCli("--file", a, "--file", otherNote, "--out", out, "--per-source", "note", "--json");
    expect(perSource.code).toBe(0);
    expect(JSON.parse(perSource.stdout)).toMatchObject({
      sources: 2,
      tensors: 1,
      chunks: 2,
      perSource: { note: ["monkeytree.source0.note", "monkeytree.source1.note"] },
      incomplete: [],
      // Raw bytes, which DCP's loader would try to unpickle: stored as torch.save of the bytes.
      wrapped: ["note", "monkeytree.source0.note", "monkeytree.source1.note"],
    });
  });
});
