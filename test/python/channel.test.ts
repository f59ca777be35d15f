import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { StagingBuffer } from "../../native/index.ts";
import { readCheckpoint } from "../../sdk/contract/checkpoint/index.ts";
import {
  CHANNEL_ENV,
  CHANNEL_VERSION,
  CRC32C_LIBRARY_ENV,
  ChannelReplySchema,
  ChannelRequestSchema,
  type Attached,
  type ChannelDirective,
  type ChannelReply,
  type ChannelRequest,
} from "../../sdk/contract/protocol/channel.ts";
import { freePort, localRendezvous } from "../helpers/net.ts";
import { canRun, torch } from "../helpers/prerequisites.ts";
import { HOOK_ENV, PYTHON } from "../helpers/python.ts";
import { SAFETY_NET_MS } from "../helpers/wait.ts";

// The Python side of the local channel (sdk/python/monkeytree/hook.py) against a scripted fake of
// `monkeytree launch`, driving examples/ddp/train.py and fixtures/probe.py.
const train = new URL("../../examples/ddp/train.py", import.meta.url).pathname;
const probeScript = new URL("./fixtures/probe.py", import.meta.url).pathname;

const hasTorch = canRun("test/python/channel.test.ts", torch());

/** Answers one request; `undefined` sends nothing (a `phase`), a string is sent as the raw line. */
type Script = (request: ChannelRequest) => ChannelReply | string | undefined;

/** The launcher's end of the channel: parses every line with the protocol's schemas, answers by script. */
class FakeLauncher {
  readonly requests: ChannelRequest[] = [];
  readonly violations: string[] = [];

  private readonly server: Server;

  private constructor(
    readonly path: string,
    script: Script,
  ) {
    this.server = createServer((socket) => {
      let pending = "";
      socket.setEncoding("utf8");
      socket.on("data", (chunk: string) => {
        pending += chunk;
        for (let end = pending.indexOf("\n"); end >= 0; end = pending.indexOf("\n")) {
          const line = pending.slice(0, end);
          pending = pending.slice(end + 1);
          const parsed = ChannelRequestSchema.safeParse(JSON.parse(line));
          if (!parsed.success) {
            this.violations.push(`${line}: ${parsed.error.message}`);
            continue;
          }
          this.requests.push(parsed.data);
          const reply = script(parsed.data);
          if (reply === undefined) continue;
          if (typeof reply !== "string") ChannelReplySchema.parse(reply); // the fake must speak the protocol too
          socket.write(`${typeof reply === "string" ? reply : JSON.stringify(reply)}\n`);
        }
      });
      socket.on("error", () => {});
    });
  }

  static async start(path: string, script: Script): Promise<FakeLauncher> {
    const launcher = new FakeLauncher(path, script);
    await new Promise<void>((resolve) => launcher.server.listen(path, resolve));
    return launcher;
  }

  of(type: ChannelRequest["type"], localRank?: number): ChannelRequest[] {
    return this.requests.filter((r) => r.type === type && (localRank === undefined || r.localRank === localRank));
  }

  close(): Promise<void> {
    return new Promise((resolve) => this.server.close(() => resolve()));
  }
}

interface Exit {
  code: number | null;
  stdout: string;
  stderr: string;
  pid: number;
}

function python(args: string[], env: Record<string, string | undefined>): Promise<Exit> {
  const base: Record<string, string | undefined> = { ...process.env, ...HOOK_ENV, PYTHONDONTWRITEBYTECODE: "1", OMP_NUM_THREADS: "1" };
  delete base[CHANNEL_ENV];
  const child = spawn(PYTHON, args, { env: { ...base, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (d: string) => (stdout += d));
  child.stderr.setEncoding("utf8").on("data", (d: string) => (stderr += d));
  return new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr, pid: child.pid ?? -1 }));
  });
}

const head = { v: CHANNEL_VERSION } as const;
type Group = Pick<Attached, "rank" | "worldSize" | "masterAddr" | "masterPort" | "generation">;
const group = (rank: number, worldSize: number, masterPort: number, generation: number): Group => ({
  rank,
  worldSize,
  masterAddr: "127.0.0.1",
  masterPort,
  generation,
});
const attached = (localRank: number, g: Group, resume: Attached["resume"] = null): ChannelReply => ({
  ...head,
  type: "attached",
  localRank,
  ...g,
  resume,
  control: null,
});
const directive = (d: ChannelDirective): ChannelReply => ({ ...head, type: "directive", directive: d });
const proceed = directive({ kind: "continue" });
const stop = directive({ kind: "stop", reason: "test" });
/** What a process reports of its first two steps after a load or a re-formation. */
const TIMED_STEPS = ["first-step", "first-step-cpu", "second-step", "second-step-cpu"];

interface Result {
  step: number;
  worldSize: number;
  generation: number;
  digest: string;
}

// Each test starts Python processes that import torch: tens of seconds each on a loaded machine.
describe.skipIf(!hasTorch)(`the Python hook on the launcher's local channel (needs torch for ${PYTHON})`, { timeout: 3 * SAFETY_NET_MS }, () => {
  let dir: string;
  const launchers: FakeLauncher[] = [];
  let socketCount = 0;
  async function launcher(script: Script): Promise<FakeLauncher> {
    const fake = await FakeLauncher.start(join(dir, `channel-${socketCount++}.sock`), script);
    launchers.push(fake);
    return fake;
  }
  const env = (fake: FakeLauncher, localRank: number): Record<string, string> => ({ [CHANNEL_ENV]: fake.path, LOCAL_RANK: String(localRank) });
  const result = (file: string): Result => JSON.parse(readFileSync(file, "utf8")) as Result;
  const steps = (requests: ChannelRequest[]): number[] => requests.map((r) => (r.type === "barrier" ? r.step : -1));

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "mt-channel-"));
  });
  afterAll(async () => {
    await Promise.all(launchers.map((l) => l.close()));
    rmSync(dir, { recursive: true, force: true });
  });

  it("attach forms the job-wide group from the channel's values; continue, then reconfigure re-forms it; stop exits 0", async () => {
    const [first, second] = [await freePort(), await freePort()];
    // The channel's ranks, not torchrun's: local rank 0 is job rank 1 until the reconfiguration swaps them back.
    const fake = await launcher((request) => {
      const local = request.localRank;
      if (request.type === "attach") return attached(local, group(1 - local, 2, first, 3));
      if (request.type !== "barrier") return undefined;
      if (request.step === 5) return directive({ kind: "reconfigure", ...group(local, 2, second, 4) });
      return request.step === 8 ? stop : proceed;
    });
    const exits = await Promise.all([0, 1].map((local) => python([probeScript], env(fake, local))));
    for (const exit of exits) expect(exit.code, exit.stderr).toBe(0);
    expect(fake.violations).toEqual([]);
    for (const local of [0, 1]) {
      const reports = (exits[local]?.stdout ?? "")
        .trim()
        .split("\n")
        .map((line) => JSON.parse(line) as Record<string, unknown>);
      const common = { localRank: local, worldSize: 2, distWorld: 2, sum: 3, managed: true, resuming: false };
      expect(reports).toEqual([
        { ...common, rank: 1 - local, distRank: 1 - local, generation: 3, pid: exits[local]?.pid },
        { ...common, rank: local, distRank: local, generation: 4, pid: exits[local]?.pid },
      ]);
      expect(fake.of("attach", local)).toEqual([{ v: 1, type: "attach", localRank: local, pid: exits[local]?.pid }]);
      // One request per barrier, one reply each: 4 continues, the reconfigure, 2 continues, the stop.
      expect(steps(fake.of("barrier", local))).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
      expect(fake.of("phase", local)).toEqual(
        ["form", "reform", ...TIMED_STEPS].map((name) => ({ v: 1, type: "phase", localRank: local, name, seconds: expect.any(Number) })),
      );
      expect(fake.of("saved", local)).toEqual([]);
    }
  });

  let plain2: Result;
  it("without MONKEYTREE_CHANNEL the example runs untouched as a plain torchrun job", async () => {
    const out = join(dir, "plain2.json");
    const exit = await python(
      ["-m", "torch.distributed.run", ...(await localRendezvous()), "--nproc_per_node=2", "--monitor_interval=0.2", train, "--steps", "6", "--out", out],
      {},
    );
    expect(exit.code, exit.stderr).toBe(0);
    plain2 = result(out);
    expect(plain2).toEqual({ step: 6, worldSize: 2, generation: 0, digest: expect.stringMatching(/^[0-9a-f]{64}$/) });
  });

  it("a reconfigure mid-training re-forms the group, DDP is rebuilt, and training ends where an unmanaged run does", async () => {
    const [first, second] = [await freePort(), await freePort()];
    const fake = await launcher((request) => {
      const local = request.localRank;
      if (request.type === "attach") return attached(local, group(local, 2, first, 0));
      if (request.type !== "barrier") return undefined;
      return request.step === 3 ? directive({ kind: "reconfigure", ...group(local, 2, second, 1) }) : proceed;
    });
    const out = join(dir, "reconfigured.json");
    const exits = await Promise.all([0, 1].map((local) => python([train, "--steps", "6", "--out", out], env(fake, local))));
    for (const exit of exits) expect(exit.code, exit.stderr).toBe(0);
    expect(fake.violations).toEqual([]);
    for (const local of [0, 1]) {
      expect(steps(fake.of("barrier", local))).toEqual([1, 2, 3, 4, 5, 6]);
      expect(fake.of("phase", local).map((p) => p.type === "phase" && p.name)).toEqual(["form", "reform", ...TIMED_STEPS]);
    }
    expect(result(out)).toEqual({ ...plain2, generation: 1 });
  });

  // One process, 8 steps: the reference run, a run that migrates out after step 3, and its replacement.
  let uninterrupted: Result;
  it("every barrier of an uninterrupted managed run gets one continue", async () => {
    const port = await freePort();
    const fake = await launcher((request) => {
      if (request.type === "attach") return attached(0, group(0, 1, port, 0));
      return request.type === "barrier" ? proceed : undefined;
    });
    const out = join(dir, "uninterrupted.json");
    const exit = await python([train, "--steps", "8", "--out", out], env(fake, 0));
    expect(exit.code, exit.stderr).toBe(0);
    expect(fake.violations).toEqual([]);
    expect(steps(fake.of("barrier"))).toEqual([1, 2, 3, 4, 5, 6, 7, 8]);
    expect(fake.requests.filter((r) => r.type !== "barrier").map((r) => r.type)).toEqual(["attach", "phase"]);
    uninterrupted = result(out);
    expect(uninterrupted.step).toBe(8);
  });

  const offset = 4096;
  let staging: StagingBuffer;
  let savedBytes: number;
  beforeAll(() => {
    staging = StagingBuffer.create({ size: 1 << 20, lock: false });
  });
  afterAll(() => staging.free());

  it("migrate-out saves into the given range, which the TypeScript reader verifies; saved carries its length; stop exits 0", async () => {
    staging.bytes(0, offset).fill(0xab);
    const port = await freePort();
    const fake = await launcher((request) => {
      if (request.type === "attach") return attached(0, group(0, 1, port, 0));
      if (request.type === "barrier") {
        return request.step === 3 ? directive({ kind: "migrate-out", buffer: staging.name, offset, length: staging.size - offset }) : proceed;
      }
      return request.type === "saved" ? stop : undefined;
    });
    const out = join(dir, "migrated.json");
    const exit = await python([train, "--steps", "8", "--out", out], env(fake, 0));
    expect(exit.code, exit.stderr).toBe(0);
    expect(fake.violations).toEqual([]);
    expect(existsSync(out)).toBe(false); // stopped after step 3
    expect(fake.requests.map((r) => (r.type === "barrier" ? `barrier ${r.step}` : r.type === "phase" ? `phase ${r.name}` : r.type))).toEqual([
      "attach",
      "phase form",
      "barrier 1",
      "barrier 2",
      "barrier 3",
      "phase checkpoint-write",
      "saved",
    ]);
    const saved = fake.of("saved")[0];
    if (saved?.type !== "saved") throw new Error("no saved message");
    savedBytes = saved.bytes;
    const view = readCheckpoint(staging.bytes(offset, savedBytes)); // checks header, metadata and every item's CRC32C
    expect(view.length).toBe(savedBytes);
    expect(view.metadata.items.map((item) => item.fqn)).toEqual(
      expect.arrayContaining([
        "model.embed.weight",
        "model.head.weight",
        "optim.blocks.0.attn.q.weight.exp_avg",
        "optim.blocks.0.attn.q.weight.step",
        "part",
        "step",
      ]),
    );
    expect(staging.bytes(0, offset).every((b) => b === 0xab)).toBe(true); // nothing written before the range
  });

  it("a replacement attached with resume loads that checkpoint and ends bit-identical to the uninterrupted run", async () => {
    const port = await freePort();
    const resume = { buffer: staging.name, offset, length: savedBytes, step: 3 };
    const fake = await launcher((request) => {
      if (request.type === "attach") return attached(0, group(0, 1, port, 0), resume);
      return request.type === "barrier" ? proceed : undefined;
    });
    const out = join(dir, "replacement.json");
    const exit = await python([train, "--steps", "8", "--out", out], env(fake, 0));
    expect(exit.code, exit.stderr).toBe(0);
    expect(fake.violations).toEqual([]);
    expect(steps(fake.of("barrier"))).toEqual([4, 5, 6, 7, 8]);
    expect(fake.of("phase").map((p) => p.type === "phase" && p.name)).toEqual(["form", "load", ...TIMED_STEPS]);
    expect(result(out)).toEqual(uninterrupted);
  });

  it("after migrate-out the launcher may roll back (continue) or reconfigure instead of stopping", async () => {
    const [first, second] = [await freePort(), await freePort()];
    const staged = StagingBuffer.create({ size: 1 << 16, lock: false });
    let barriers = 0;
    const fake = await launcher((request) => {
      if (request.type === "attach") return attached(0, group(0, 1, first, 0));
      if (request.type === "barrier")
        return request.step === 2 || request.step === 4
          ? directive({ kind: "migrate-out", buffer: staged.name, offset: 0, length: staged.size })
          : request.step === 5
            ? stop
            : proceed;
      if (request.type !== "saved") return undefined;
      return ++barriers === 1 ? proceed : directive({ kind: "reconfigure", ...group(0, 1, second, 1) });
    });
    try {
      const exit = await python([probeScript], env(fake, 0));
      expect(exit.code, exit.stderr).toBe(0);
      expect(fake.violations).toEqual([]);
      expect(
        exit.stdout
          .trim()
          .split("\n")
          .map((line) => (JSON.parse(line) as { generation: number }).generation),
      ).toEqual([0, 1]);
      expect(fake.requests.map((r) => (r.type === "barrier" ? `barrier ${r.step}` : r.type === "phase" ? `phase ${r.name}` : r.type))).toEqual([
        "attach",
        "phase form",
        "barrier 1",
        "barrier 2",
        "phase checkpoint-write",
        "saved",
        "barrier 3",
        "barrier 4",
        "phase checkpoint-write",
        "saved",
        "phase reform",
        "phase first-step",
        "phase first-step-cpu",
        "barrier 5",
      ]);
      const last = fake.of("saved")[1];
      if (last?.type !== "saved") throw new Error("no second saved message");
      expect(readCheckpoint(staged.bytes(0, last.bytes)).length).toBe(last.bytes);
    } finally {
      staged.free();
    }
  });

  it("attach says once on stderr that checksums take the slow path when the launcher named no CRC32C library", async () => {
    const port = await freePort();
    const fake = await launcher((request) => {
      if (request.type === "attach") return attached(0, group(0, 1, port, 0));
      return request.type === "barrier" ? stop : undefined;
    });
    const exit = await python([probeScript], { ...env(fake, 0), [CRC32C_LIBRARY_ENV]: undefined });
    expect(exit.code, exit.stderr).toBe(0);
    // Said at the start, though this process never migrates and so never checksums anything.
    expect(exit.stderr.match(/^monkeytree: MONKEYTREE_CRC32C_LIB is not set .*torch CRC32C.*$/gm)).toHaveLength(1);
  });

  it("an error reply or a malformed line raises ChannelError naming the problem, and the process exits non-zero", async () => {
    const port = await freePort();
    const cases: [Script, RegExp][] = [
      [
        (r) => (r.type === "attach" ? { ...head, type: "error", message: "no job J on this host" } : undefined),
        /ChannelError: the launcher refused: no job J on this host/,
      ],
      [
        (r) =>
          r.type === "attach"
            ? JSON.stringify({ ...head, type: "attached", localRank: 0, ...group(0, 1, port, 0), masterPort: 0, resume: null, control: null })
            : undefined,
        /ChannelError: attached message: masterPort must be an integer/,
      ],
      [
        (r) => (r.type === "attach" ? attached(0, group(0, 1, port, 0)) : r.type === "barrier" ? "{not json" : undefined),
        /ChannelError: the launcher sent a line that is not JSON/,
      ],
    ];
    const exits = await Promise.all(cases.map(async ([script]) => python([probeScript], env(await launcher(script), 0))));
    exits.forEach((exit, index) => {
      expect(exit.code).not.toBe(0);
      expect(exit.stderr).toMatch(cases[index]?.[1] ?? /never/);
    });
  });
});
