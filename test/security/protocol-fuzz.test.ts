import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import fc from "fast-check";
import { afterAll, describe, expect, it } from "vitest";
import { curveKeyPair, Dealer } from "zeromq";
import { CLI } from "../../cli/paths.ts";
import { nodeArgs } from "../../sdk/contract/paths.ts";
import { send, StagingBuffer, transferTicketSchema } from "../../native/index.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient } from "../../sdk/client/client.ts";
import { readCredential, sharedSecret, signFrame, type Credential } from "../../sdk/contract/protocol/auth.ts";
import { RequestSchema } from "../../sdk/contract/protocol/codec.ts";
import { CommandReplySchema } from "../../sdk/contract/protocol/commands.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { MAX_GPUS_PER_HOST, MAX_HOSTS, MAX_REQUEST_BYTES, MAX_TEXT_LENGTH } from "../../sdk/contract/protocol/limits.ts";
import { HOLD_PHASES } from "../../sdk/contract/protocol/worker.ts";
import { runCli } from "../helpers/cli.ts";

/**
 * The protocol fuzzer: a running `monkeytree controller` (with a keyring, as a shared
 * cluster runs it) and a daemon's transfer listener, each in a process of its own, are fed
 * generated malformed messages over several connections, with legitimate requests between
 * batches. Both must stay up, answer every legitimate request within SAFETY_MS, and keep their
 * peak memory within a bound of where it started.
 *
 * Reproduce a failure with the seed fast-check prints: `FUZZ_SEED=… npx vitest run
 * test/security/protocol-fuzz.test.ts`; `FUZZ_RUNS` sets the number of batches (default 200,
 * of 50 messages each: 10,000 per process).
 */

const BATCH = 50;
const RUNS = Number(process.env.FUZZ_RUNS ?? 200);
const SEED = process.env.FUZZ_SEED === undefined ? undefined : Number(process.env.FUZZ_SEED);
// A failure leaves the process in whatever state the fuzz put it in, so shrinking would replay
// against a different process: report the seed and the failing batch as they are.
const parameters = <T>(): fc.Parameters<T> => ({ numRuns: RUNS, endOnFailure: true, ...(SEED === undefined ? {} : { seed: SEED }) });
/** A safety bound on answering a legitimate request under fuzz, not a latency claim. */
const SAFETY_MS = 2_000;
const MiB = 1 << 20;
/**
 * Peak RSS (VmHWM) may exceed the RSS at the start of the fuzz by this much. A controller
 * reads at most one frame of MAX_REQUEST_BYTES per connection at a time and keeps nothing of a
 * rejected message; what it keeps of accepted ones (a few fuzz jobs, their journal records) is
 * kilobytes. The rest is garbage the heap collects in its own time: a young generation of
 * 16-32 MiB and old-space growth before a major GC. 160 MiB leaves room for that on a loaded
 * machine, and is a sixth of what one 256 MiB frame cost before frames were bounded.
 */
const CONTROLLER_RSS_GROWTH = 160 * MiB;
/** The listener allocates per connection (a thread, a 48-byte hello) and frees it on close. */
const LISTENER_RSS_GROWTH = 32 * MiB;

const dir = mkdtempSync(join(tmpdir(), "monkeytree-protocol-fuzz-"));
const children: ChildProcess[] = [];
afterAll(() => {
  for (const child of children) if (child.exitCode === null) child.kill("SIGKILL");
  rmSync(dir, { recursive: true, force: true });
});

/** A child process whose stdout is JSON or text lines, waited for by predicate. */
class Child {
  readonly stderr: string[] = [];
  private readonly lines: string[] = [];
  private readonly waiters = new Set<() => void>();

  constructor(readonly process: ChildProcess) {
    children.push(process);
    createInterface({ input: process.stdout! }).on("line", (line) => {
      this.lines.push(line);
      for (const wake of this.waiters) wake();
    });
    createInterface({ input: process.stderr! }).on("line", (line) => this.stderr.push(line));
  }

  /** Why the process is no longer running, or null while it runs. */
  get exited(): string | null {
    const { exitCode, signalCode } = this.process;
    return exitCode === null && signalCode === null ? null : `exited with ${exitCode ?? signalCode}; last log lines:\n${this.stderr.slice(-20).join("\n")}`;
  }

  /** The first line `match` accepts (and removes), within `timeoutMs`. */
  async line<T>(match: (line: string) => T | undefined, timeoutMs: number, what: string): Promise<T> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      for (const [i, line] of this.lines.entries()) {
        const found = match(line);
        if (found !== undefined) {
          this.lines.splice(i, 1);
          return found;
        }
      }
      if (this.exited) throw new Error(`waiting for ${what}: the process ${this.exited}`);
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`no ${what} within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          this.waiters.delete(wake);
          resolve();
        };
        const timer = setTimeout(wake, Math.min(left, 100));
        this.waiters.add(wake);
      });
    }
  }

  /** Resident and peak resident memory, in bytes, from /proc. */
  memory(): { rss: number; peak: number } {
    const status = readFileSync(`/proc/${this.process.pid}/status`, "utf8");
    const kib = (field: string) => Number(new RegExp(`^${field}:\\s+(\\d+) kB$`, "m").exec(status)?.[1] ?? Number.NaN) * 1024;
    return { rss: kib("VmRSS"), peak: kib("VmHWM") };
  }
}

const json = (line: string): Record<string, unknown> | undefined => {
  try {
    return JSON.parse(line) as Record<string, unknown>;
  } catch {
    return undefined;
  }
};

/** Numbers at and past the limits, and the ones JSON writers get wrong. */
const EDGE_NUMBERS = [-1, -0, 0.5, 1.5, 2 ** 31, 2 ** 32, 2 ** 53, 1e308, -1e308, MAX_HOSTS, MAX_GPUS_PER_HOST + 1, Number.MAX_SAFE_INTEGER];
/** Anything a field could wrongly hold: other types, edge numbers, long or odd strings, nesting. */
const junk = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  fc.constantFrom(...EDGE_NUMBERS),
  fc.string({ unit: "binary", maxLength: 24 }),
  fc.constantFrom("x".repeat(4 * MAX_TEXT_LENGTH), "a\n[controller] forged", "\u001b[2J", "NaN", "Infinity"),
);
/** Mostly a plausible value, sometimes junk. */
const field = <T>(plausible: fc.Arbitrary<T>) => fc.oneof({ weight: 5, arbitrary: plausible }, { weight: 1, arbitrary: junk });

describe("a controller fed malformed messages", () => {
  const FUZZ_JOBS = ["fuzz-0", "fuzz-1", "fuzz-2", "fuzz-3"];
  /** The legitimate job sits on a host the fuzz never names, alone in its rack, so no plan moves it. */
  const REAL_HOST = 100;

  const REQUEST_TYPES = RequestSchema.options.map((o) => o.shape.type.value);
  const ANSWER_TYPES = CommandReplySchema.options.map((o) => o.shape.type.value);
  const host = fc.oneof(
    { weight: 6, arbitrary: fc.integer({ min: 0, max: 15 }) },
    { weight: 1, arbitrary: fc.constantFrom(-1, MAX_HOSTS - 1, MAX_HOSTS, 1.5, 2 ** 53) },
  );
  const job = fc.constantFrom(...FUZZ_JOBS, "real", "nobody");
  const worker = fc.record({ job: field(job), group: field(fc.integer({ min: 0, max: 2 })), host: field(host) });
  const parallelism = fc.record({
    tp: field(fc.integer({ min: 1, max: 4 })),
    pp: field(fc.integer({ min: 1, max: 2 })),
    dp: field(fc.integer({ min: 1, max: 4 })),
  });
  const count = field(fc.nat({ max: 1 << 20 }));
  const hex = fc.uint8Array({ minLength: 16, maxLength: 16 }).map((bytes) => Buffer.from(bytes).toString("hex"));

  /** A request of each kind a controller takes (a daemon's answers to commands included), its fields fuzzed. */
  const bodies: Record<string, fc.Arbitrary<Record<string, unknown>>> = {
    "worker.register": fc.record(
      { worker, parallelism, checkpointBytes: count, rings: field(fc.integer({ min: 1, max: 4 })) },
      { requiredKeys: ["worker", "parallelism", "checkpointBytes"] },
    ),
    "worker.report": fc.record({
      worker,
      generation: count,
      step: field(fc.option(fc.nat({ max: 1 << 20 }))),
      stepMs: field(fc.option(fc.double({ min: 0, max: 1e6, noNaN: true }))),
      hold: field(fc.option(fc.record({ stop: field(fc.constantFrom("s1", "stop-0")), step: count, phase: field(fc.constantFrom(...HOLD_PHASES)) }))),
    }),
    "job.finish": fc.record({ job: field(job) }),
    status: fc.record({}),
    events: fc.record({ after: count }, { requiredKeys: [] }),
    "daemon.register": fc.record({
      host: field(host),
      incarnation: field(hex),
      stagingBytes: count,
      endpoint: field(fc.constantFrom("tcp://127.0.0.1:7000", "tcp://[::1]:1?rdma")),
    }),
    "daemon.heartbeat": fc.record({ host: field(host), incarnation: field(hex) }),
    "daemon.transfer-result": fc.record({ host: field(host), token: field(hex), bytes: count, outcome: field(fc.constantFrom("verified", "failed")) }),
    "daemon.replacement-exited": fc.record({
      host: field(host),
      migration: field(fc.constantFrom("p0/0", "p1/2")),
      token: field(hex),
      code: field(fc.constantFrom(0, 1, 255, null)),
      signal: field(fc.constantFrom(null, "SIGKILL")),
    }),
    "daemon.vouch": fc.record({ host: field(host), incarnation: field(hex), job: field(job) }),
    "daemon.prepared": fc.record({ host: field(host), endpoint: junk, token: field(hex) }),
    "daemon.done": fc.record({ host: field(host) }),
    "daemon.refused": fc.record({ host: field(host), code: field(fc.constantFrom("no_space", "malformed")), message: junk }),
  };

  const type = fc.oneof(
    { weight: 8, arbitrary: fc.constantFrom(...REQUEST_TYPES, ...ANSWER_TYPES) },
    { weight: 1, arbitrary: fc.oneof(fc.string({ maxLength: 12 }), fc.constant("t".repeat(10_000)), junk) },
  );
  /** An envelope and a body, each field possibly junk, possibly with a field removed or one added. */
  const envelope = fc
    .record({
      // Now and then a peer of the previous release (version 1).
      v: fc.oneof({ weight: 8, arbitrary: fc.constant(PROTOCOL_VERSION) }, { weight: 1, arbitrary: fc.constant(1) }, { weight: 1, arbitrary: junk }),
      type,
      id: fc.oneof({ weight: 8, arbitrary: fc.nat({ max: 1_000_000 }) }, { weight: 1, arbitrary: junk }),
    })
    .chain((head) =>
      fc
        .record({
          body:
            typeof head.type === "string" && Object.hasOwn(bodies, head.type)
              ? bodies[head.type]!
              : fc.dictionary(fc.string({ maxLength: 8 }), junk, { maxKeys: 4 }),
          drop: fc.option(fc.constantFrom("v", "type", "id", "worker", "host", "job"), { freq: 8 }),
          extra: fc.option(fc.tuple(fc.string({ maxLength: 8 }), junk), { freq: 8 }),
        })
        .map(({ body, drop, extra }) => {
          const message: Record<string, unknown> = { ...head, ...body, ...(extra ? { [extra[0]]: extra[1] } : {}) };
          if (drop) delete message[drop];
          return message;
        }),
    );

  /** What travels as the request frame. `oversized` and `large` are built when sent, so generating them is cheap. */
  type Body = { text: string } | { bytes: Uint8Array } | { oversized: number } | { large: number };
  const body: fc.Arbitrary<Body> = fc.oneof(
    { weight: 300, arbitrary: envelope.map((message) => ({ text: JSON.stringify(message) })) },
    { weight: 60, arbitrary: fc.uint8Array({ maxLength: 64 }).map((bytes) => ({ bytes })) },
    // Cut short: the parser meets the end of input inside a string, a number or a nesting.
    {
      weight: 60,
      arbitrary: fc
        .tuple(envelope, fc.double({ min: 0, max: 1, noNaN: true }))
        .map(([m, at]) => ({ text: JSON.stringify(m).slice(0, Math.floor(JSON.stringify(m).length * at)) })),
    },
    // Numbers JSON has no word for, and the spellings of them some writers produce.
    {
      weight: 30,
      arbitrary: fc
        .tuple(
          fc.constantFrom("NaN", "Infinity", "-Infinity", "1e999", "-0", "0x10", "01", "1e-400", "9007199254740993", "null"),
          fc.constantFrom("id", "v", "host", "step", "stepMs", "hold.step"),
        )
        .map(([n, at]) => ({
          text:
            `{"v":${at === "v" ? n : PROTOCOL_VERSION},"type":"worker.report","id":${at === "id" ? n : 1},"worker":{"job":"fuzz-0","group":0,"host":${at === "host" ? n : 0}},` +
            `"generation":0,"step":${at === "step" ? n : 0},"stepMs":${at === "stepMs" ? n : 10},"hold":{"stop":"s1","step":${at === "hold.step" ? n : 1},"phase":"armed"}}`,
        })),
    },
    // Deep nesting, of arrays or objects, in a field or as the whole message.
    {
      weight: 20,
      arbitrary: fc.tuple(fc.integer({ min: 1, max: 100_000 }), fc.boolean(), fc.boolean()).map(([depth, arrays, inside]) => {
        const [open, close] = arrays ? ["[", "]"] : ['{"a":', "}"];
        const nested = `${open.repeat(depth)}${arrays ? "" : "0"}${close.repeat(depth)}`;
        return { text: inside ? `{"v":${PROTOCOL_VERSION},"type":"status","id":1,"x":${nested}}` : nested };
      }),
    },
    { weight: 10, arbitrary: fc.integer({ min: MAX_REQUEST_BYTES / 4, max: MAX_REQUEST_BYTES - 64 }).map((large) => ({ large })) },
    { weight: 2, arbitrary: fc.integer({ min: MAX_REQUEST_BYTES + 1, max: 3 * MAX_REQUEST_BYTES }).map((oversized) => ({ oversized })) },
  );

  /** The auth frame: the sender's true MAC, none, garbage, or `{ key, mac }` that lies; and any frames after it. */
  type Auth = "valid" | "none" | { bytes: Uint8Array } | { key: unknown; mac: unknown };
  const auth: fc.Arbitrary<Auth> = fc.oneof(
    { weight: 12, arbitrary: fc.constant("valid" as const) },
    { weight: 2, arbitrary: fc.constant("none" as const) },
    { weight: 1, arbitrary: fc.uint8Array({ maxLength: 96 }).map((bytes) => ({ bytes })) },
    { weight: 2, arbitrary: fc.record({ key: field(fc.constantFrom("", "0".repeat(40))), mac: field(hex.map((h) => h.repeat(2))) }) },
  );
  const message = fc.record({
    body,
    auth,
    more: fc.oneof(
      { weight: 12, arbitrary: fc.constant([]) },
      { weight: 1, arbitrary: fc.array(fc.uint8Array({ maxLength: 16 }), { minLength: 1, maxLength: 6 }) },
    ),
  });
  type Message = typeof message extends fc.Arbitrary<infer T> ? T : never;

  /** One fuzzing connection, as a tenant holding `credential` (or a stranger's key, or none) would open it. */
  class FuzzPeer {
    readonly socket: Dealer;
    /** Reply ids, as far as a reply is JSON with one; the answers to syncs are removed. */
    readonly answered: number[] = [];
    readonly codes = new Map<string, number>();
    private readonly sign: ((frame: string | Buffer) => string) | null;
    private readonly syncs = new Map<number, () => void>();
    private nextSync = 2_000_000_000;

    constructor(endpoint: string, key: Credential | "stranger" | "plain") {
      // Strangers' messages pile up unsent while their handshake fails: never wait for room.
      this.socket = new Dealer({ linger: 0, ...(typeof key === "string" ? { sendTimeout: 0 } : {}) });
      const pair = key === "stranger" ? curveKeyPair() : null;
      const credential = typeof key === "object" ? key : null;
      if (credential || pair) {
        this.socket.curveServerKey = credential?.serverKey ?? serverKey;
        this.socket.curvePublicKey = credential?.publicKey ?? pair!.publicKey;
        this.socket.curveSecretKey = credential?.secretKey ?? pair!.secretKey;
      }
      const secret = credential ? sharedSecret(credential, credential.serverKey) : null;
      this.sign = credential && secret ? (frame) => signFrame(credential, secret, frame) : null;
      this.socket.connect(endpoint);
      void this.receive();
    }

    private async receive(): Promise<void> {
      try {
        for await (const [frame] of this.socket) {
          const reply = json(frame?.toString() ?? "");
          const id = typeof reply?.id === "number" ? reply.id : -1;
          const wake = this.syncs.get(id);
          if (wake) {
            wake();
            continue;
          }
          this.answered.push(id);
          const code = `${String(reply?.type)}${reply?.code ? `/${String(reply.code)}` : ""}`;
          this.codes.set(code, (this.codes.get(code) ?? 0) + 1);
        }
      } catch {
        // Closed.
      }
    }

    async send(m: Message, oversizedId: number): Promise<void> {
      const frame = frameOf(m.body, oversizedId);
      const proof = m.auth === "valid" ? (this.sign?.(frame) ?? null) : m.auth === "none" ? null : "bytes" in m.auth ? m.auth.bytes : JSON.stringify(m.auth);
      try {
        await this.socket.send([frame, ...(proof === null ? [] : [proof]), ...m.more]);
      } catch (error) {
        if ((error as { code?: string }).code !== "EAGAIN") throw error;
      }
    }

    /**
     * Sends a signed `status` (which a job credential is refused) and waits for its answer, so
     * every message sent before it on this connection has been read: one connection's frames
     * reach the controller in order. A frame over the size limit drops the connection, with
     * whatever was queued behind it, so an unanswered sync is sent again on the new one.
     */
    async sync(): Promise<void> {
      for (let attempt = 0; attempt < 10; attempt++) {
        const id = this.nextSync++;
        const answered = new Promise<boolean>((resolve) => {
          const timer = setTimeout(() => resolve(false), SAFETY_MS);
          this.syncs.set(id, () => {
            clearTimeout(timer);
            resolve(true);
          });
        });
        const frame = JSON.stringify({ v: PROTOCOL_VERSION, type: "status", id });
        await this.socket.send([frame, this.sign!(frame)]);
        const done = await answered;
        this.syncs.delete(id);
        if (done) return;
      }
      throw new Error("a fuzzing connection got no answer to 10 syncs in a row");
    }
  }

  let serverKey = "";
  function frameOf(b: Body, oversizedId: number): string | Buffer {
    if ("text" in b) return b.text;
    if ("bytes" in b) return Buffer.from(b.bytes);
    // A well-formed request with a long job id: answered (malformed) if it is read at all.
    const size = "large" in b ? b.large : b.oversized;
    const head = `{"v":${PROTOCOL_VERSION},"type":"job.finish","id":${"large" in b ? 1 : oversizedId},"job":"`;
    return `${head}${"j".repeat(size - head.length - 2)}"}`;
  }

  it(`stays up, answers legitimate requests within ${SAFETY_MS} ms and keeps its memory bounded`, { timeout: 600_000 }, async () => {
    expect(Object.keys(bodies).sort()).toEqual([...REQUEST_TYPES, ...ANSWER_TYPES].sort());
    const keys = join(dir, "keys");
    const made = await runCli("keys", "--dir", keys, "--operator", "ops", "--job", "real", ...FUZZ_JOBS.flatMap((j) => ["--job", j]));
    expect(made.code).toBe(0);
    const credential = (name: string) => readCredential(join(keys, `${name}.json`));
    const controller = new Child(
      spawn(
        process.execPath,
        [...CLI, "controller", "--keys", keys, "--journal", join(dir, "journal"), "--bind", "tcp://127.0.0.1:*", "--plan-time-limit", "0.2"],
        { stdio: ["ignore", "pipe", "pipe"] },
      ),
    );
    const endpoint = await controller.line((line) => /^controller listening on (\S+)$/.exec(line)?.[1], 60_000, "the controller's endpoint");
    serverKey = credential("operator-ops").serverKey;

    const operator = new ControllerClient({ endpoint, credential: credential("operator-ops"), timeoutMs: SAFETY_MS });
    const real = new ControllerClient({ endpoint, credential: credential("job-real"), timeoutMs: SAFETY_MS });
    const tenants = FUZZ_JOBS.map((j) => new FuzzPeer(endpoint, credential(`job-${j}`)));
    const strangers = [new FuzzPeer(endpoint, "stranger"), new FuzzPeer(endpoint, "plain")];
    const latencies: number[] = [];
    const timed = async <T>(request: Promise<T>): Promise<T> => {
      const started = performance.now();
      const answer = await request;
      latencies.push(performance.now() - started);
      return answer;
    };
    const worker = new WorkerClient(real, { job: "real", group: 0, host: REAL_HOST }, { tp: 1, pp: 1, dp: 1 });
    try {
      await worker.register(60_000);
      expect((await operator.status(60_000)).jobs.map((j) => j.id)).toEqual(["real"]);
      await Promise.all(tenants.map((t) => t.sync()));
      const start = controller.memory();

      let step = 0;
      let sent = 0;
      const oversized = new Set<number>();
      await fc.assert(
        fc.asyncProperty(fc.array(message, { minLength: BATCH, maxLength: BATCH }), async (batch) => {
          // One message of a batch per stranger (they never get past the handshake), the rest
          // round-robin to the tenants.
          const s = strangers.length;
          const owner = (i: number) => (i < s ? i : s + ((i - s) % tenants.length));
          await Promise.all(
            [...strangers, ...tenants].map(async (peer, p) => {
              for (const [i, m] of batch.entries()) {
                if (owner(i) !== p) continue;
                const id = 1_000_000_000 + sent + i;
                if ("oversized" in m.body) oversized.add(id);
                await peer.send(m, id);
              }
            }),
          );
          sent += batch.length;
          await Promise.all(tenants.map((t) => t.sync()));
          expect(controller.exited).toBeNull();
          const status = await timed(operator.status());
          expect(status.jobs.find((j) => j.id === "real")).toMatchObject({ hosts: [REAL_HOST], started: true });
          // A barrier answers on the host; the report is what the controller must answer.
          expect(await worker.barrier(++step)).toEqual({ kind: "continue" });
          expect(await timed(real.report({ worker: worker.worker, generation: 0, step, stepMs: null, hold: null }))).toEqual({ kind: "run" });
        }),
        parameters(),
      );
      const end = controller.memory();

      const answered = tenants.flatMap((t) => t.answered);
      const codes = new Map<string, number>();
      for (const t of tenants) for (const [code, n] of t.codes) codes.set(code, (codes.get(code) ?? 0) + n);
      process.stderr.write(
        `controller fuzz: ${sent} messages, ${answered.length} answered (${[...codes].map(([c, n]) => `${c} ${n}`).join(", ")}); ` +
          `legitimate requests answered in at most ${Math.max(...latencies).toFixed(0)} ms; RSS ${(start.rss / MiB).toFixed(0)} MiB at the start, peak ${(end.peak / MiB).toFixed(0)} MiB\n`,
      );
      expect(sent).toBe(RUNS * BATCH);
      // The fuzz reached the parser and the authorisation rules, not only the rate limiter.
      expect(codes.get("error/malformed") ?? 0).toBeGreaterThan(sent / 10);
      expect(codes.get("error/forbidden") ?? 0).toBeGreaterThan(sent / 50);
      expect(answered.filter((id) => oversized.has(id))).toEqual([]);
      expect(end.peak - start.rss).toBeLessThan(CONTROLLER_RSS_GROWTH);
      expect(Math.max(...controller.stderr.map((line) => line.length))).toBeLessThan(2 * MAX_TEXT_LENGTH);
      expect(controller.exited).toBeNull();
    } finally {
      worker.close();
      for (const peer of [...tenants, ...strangers]) peer.socket.close();
      await Promise.all([operator.close(), real.close()]);
      controller.process.kill("SIGTERM");
      await once(controller.process, "exit");
    }
  });
});

describe("a daemon's transfer listener fed malformed hellos", () => {
  const MAGIC = 0x3158544d;
  const LEGIT_BYTES = MiB;
  const FUZZ_BYTES = 4096;

  /** Which token a hello carries: a random one, the live grant the fuzz aims at, or a spent one. */
  type TokenKind = "random" | "fuzz" | "spent";
  const u16 = fc.integer({ min: 0, max: 0xffff });
  const u32 = fc.integer({ min: 0, max: 0xffffffff });
  const mutable = <T>(valid: T, mutant: fc.Arbitrary<T>) => fc.oneof({ weight: 4, arbitrary: fc.constant(valid) }, { weight: 1, arbitrary: mutant });
  const hello = fc.record({
    magic: mutable(MAGIC, u32),
    version: mutable(1, u16),
    streamIndex: mutable(0, u16),
    streamCount: mutable(1, u16),
    transport: mutable(0, u16),
    chunkSize: mutable(FUZZ_BYTES, u32),
    length: mutable(BigInt(FUZZ_BYTES), fc.bigInt({ min: 0n, max: 2n ** 64n - 1n })),
    token: fc.constantFrom<TokenKind>("random", "fuzz", "fuzz", "spent"),
    random: fc.uint8Array({ minLength: 16, maxLength: 16 }),
  });
  /** What follows an accepted hello: chunk headers with any kind, length and offset, and payloads. */
  const chunks = fc.array(
    fc.record({
      kind: mutable(1, u32),
      length: mutable(FUZZ_BYTES, u32),
      offset: mutable(0n, fc.bigInt({ min: 0n, max: 2n ** 64n - 1n })),
      payload: fc.uint8Array({ maxLength: 64 }),
    }),
    { maxLength: 3 },
  );
  const connection = fc.oneof(
    { weight: 2, arbitrary: fc.uint8Array({ maxLength: 96 }).map((bytes) => ({ bytes })) },
    { weight: 6, arbitrary: fc.record({ hello, cut: fc.option(fc.integer({ min: 0, max: 47 }), { freq: 2 }), chunks }) },
  );
  type Connection = typeof connection extends fc.Arbitrary<infer T> ? T : never;

  function bytesOf(c: Connection, tokens: Record<TokenKind, Buffer>): Buffer {
    if ("bytes" in c) return Buffer.from(c.bytes);
    const { hello: h } = c;
    const head = Buffer.alloc(48);
    head.writeUInt32LE(h.magic, 0);
    head.writeUInt16LE(h.version, 4);
    head.writeUInt16LE(h.streamIndex, 6);
    head.writeUInt16LE(h.streamCount, 8);
    head.writeUInt16LE(h.transport, 10);
    head.writeUInt32LE(h.chunkSize, 12);
    head.writeBigUInt64LE(h.length, 16);
    (h.token === "random" ? Buffer.from(h.random) : tokens[h.token]).copy(head, 24);
    if (c.cut !== null) return head.subarray(0, c.cut);
    const tail = c.chunks.map(({ kind, length, offset, payload }) => {
      const header = Buffer.alloc(16);
      header.writeUInt32LE(kind, 0);
      header.writeUInt32LE(length, 4);
      header.writeBigUInt64LE(offset, 8);
      return Buffer.concat([header, payload]);
    });
    return Buffer.concat([head, ...tail]);
  }

  /**
   * Writes the bytes, ends its side, and waits for the listener to close the connection; returns
   * the code of the listener's first reply ("" for an accepted hello), or null when it sent none.
   */
  async function deliver(port: number, bytes: Buffer): Promise<string | null> {
    const socket = connect(port, "127.0.0.1");
    const received: Buffer[] = [];
    // A listener closing with bytes unread resets the connection: that is a close here too.
    socket.on("error", () => undefined);
    socket.on("data", (chunk: Buffer) => received.push(chunk));
    const closed = new Promise((resolve) => socket.once("close", resolve));
    socket.end(bytes);
    const timer = setTimeout(() => socket.destroy(), 4 * SAFETY_MS);
    await closed;
    clearTimeout(timer);
    const reply = Buffer.concat(received);
    return reply.length < 8 ? null : reply.subarray(8, 8 + reply.readUInt32LE(0)).toString();
  }

  it(`stays up, serves a legitimate sender within ${SAFETY_MS} ms after every batch and keeps its memory bounded`, { timeout: 600_000 }, async () => {
    const listener = new Child(spawn(process.execPath, nodeArgs(import.meta.url, "./fixtures/listener-process"), { stdio: ["pipe", "pipe", "pipe"] }));
    const port = await listener.line((line) => json(line)?.port as number | undefined, 60_000, "the listener's port");
    const ticketOf = async (use: "grant" | "fuzz") => {
      listener.process.stdin!.write(`${use}\n`);
      const line = await listener.line((l) => (json(l)?.use === use ? json(l) : undefined), SAFETY_MS, `a ${use} ticket`);
      return transferTicketSchema.parse(line.ticket);
    };
    const source = StagingBuffer.create({ size: LEGIT_BYTES, lock: false });
    source.bytes().set(randomBytes(LEGIT_BYTES));
    const tokens: Record<TokenKind, Buffer> = { random: Buffer.alloc(16), fuzz: Buffer.alloc(16), spent: Buffer.alloc(16) };
    const latencies: number[] = [];
    /** A legitimate transfer: granted, sent and verified, the whole of it within SAFETY_MS. */
    const legitimate = async () => {
      const started = performance.now();
      const ticket = await ticketOf("grant");
      await send({ ticket, buffer: source, transport: "tcp", streams: 2, chunkSize: 256 * 1024, idleTimeout: SAFETY_MS / 1000 });
      const settled = await listener.line((l) => (json(l)?.token === ticket.token ? json(l) : undefined), SAFETY_MS, "the grant's outcome");
      latencies.push(performance.now() - started);
      expect(settled).toEqual({ token: ticket.token, crc: source.crc32c() });
      expect(latencies.at(-1)).toBeLessThan(SAFETY_MS);
      tokens.spent = Buffer.from(ticket.token, "hex");
    };
    try {
      await legitimate();
      const start = listener.memory();
      let sent = 0;
      const codes = new Map<string, number>();
      await fc.assert(
        fc.asyncProperty(fc.array(connection, { minLength: BATCH, maxLength: BATCH }), async (batch) => {
          // A fresh grant to aim at every few batches: the fuzz spends or fails the one before.
          if (sent % (10 * BATCH) === 0) tokens.fuzz = Buffer.from((await ticketOf("fuzz")).token, "hex");
          const queue = [...batch];
          await Promise.all(
            Array.from({ length: 8 }, async () => {
              for (let c = queue.shift(); c; c = queue.shift()) {
                const code = (await deliver(port, bytesOf(c, tokens))) ?? "no reply";
                codes.set(code, (codes.get(code) ?? 0) + 1);
              }
            }),
          );
          sent += batch.length;
          expect(listener.exited).toBeNull();
          await legitimate();
        }),
        parameters(),
      );
      const end = listener.memory();
      process.stderr.write(
        `listener fuzz: ${sent} connections (${[...codes].map(([c, n]) => `${c || "accepted"} ${n}`).join(", ")}); legitimate 1 MiB transfers done in at most ${Math.max(...latencies).toFixed(0)} ms; ` +
          `RSS ${(start.rss / MiB).toFixed(0)} MiB at the start, peak ${(end.peak / MiB).toFixed(0)} MiB\n`,
      );
      expect(sent).toBe(RUNS * BATCH);
      // The fuzz got past the magic to the token check, and past accepted hellos to the chunks.
      for (const code of ["protocol", "bad_token", "token_used", ""]) expect(codes.get(code) ?? 0).toBeGreaterThan(0);
      expect(end.peak - start.rss).toBeLessThan(LISTENER_RSS_GROWTH);
      expect(listener.exited).toBeNull();
    } finally {
      source.free();
      listener.process.kill("SIGTERM");
      await once(listener.process, "exit");
    }
  });
});
