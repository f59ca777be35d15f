import { randomFillSync } from "node:crypto";
import { chmodSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { userInfo } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { Dealer, curveKeyPair } from "zeromq";
import { HostDaemon } from "../../controller/daemon/daemon.ts";
import { DaemonHosts } from "../../controller/service/daemon-hosts.ts";
import { loadKeyring } from "../../controller/service/keys.ts";
import { send, StagingBuffer } from "../../native/index.ts";
import { WorkerClient } from "../../sdk/client/agent.ts";
import { ControllerClient, ControllerError, ControllerTimeoutError } from "../../sdk/client/client.ts";
import { readCredential, sharedSecret, signFrame, type Credential } from "../../sdk/contract/protocol/auth.ts";
import { ticketFor } from "../../sdk/contract/protocol/endpoint.ts";
import { PROTOCOL_VERSION } from "../../sdk/contract/protocol/envelope.ts";
import { shellCommand } from "../../cli/demo/processes.ts";
import { TENANT, tenantDir } from "../helpers/tenant.ts";
import { runCli } from "../helpers/cli.ts";
import { INCARNATION, plannedMoves, startController, tempDir, type Harness } from "../service/harness.ts";
import type { ServerOptions } from "../../controller/service/server.ts";
import { patiently } from "../helpers/wait.ts";

// A controller with a keyring against clients that impersonate a job or a daemon, act for
// another, or bring a key of their own: each must fail as docs/controller.md ("Who may do what") says,
// and a legitimate job must still migrate.

const CHECKPOINT = 1 << 20;
const dp2 = { tp: 1, pp: 1, dp: 2 };
let keys: string;
const credential = (name: string): Credential => readCredential(join(keys, `${name}.json`));
/** Who the jobs' replacements run as: nobody when the tests run as root, else the tests' user. */
const JOB_USER = TENANT?.user ?? userInfo().username;
/** Each host's replacement's file: it writes its uid to `${file}.uid`, and runs until the file is gone. */
const markers = new Map<number, string>();

beforeAll(async () => {
  keys = tempDir();
  // The jobs' replacements run as their own user, named beside their keys, not a daemon's --run-as.
  const made = await runCli("keys", "--dir", keys, "--daemon", "0-7", "--job", "a", "--job", "b", "--user", JOB_USER, "--operator", "ops");
  expect(made, made.stderr).toMatchObject({ code: 0 });
  return () => rmSync(keys, { recursive: true, force: true });
});

let harness: Harness | undefined;
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  await harness?.close();
  harness = undefined;
});

async function keyedController(overrides: Partial<ServerOptions> = {}): Promise<Harness> {
  const daemons = new DaemonHosts(60_000);
  harness = await startController({
    overrides: { keyring: loadKeyring(keys), transport: daemons, launcher: daemons, daemons, heartbeatTimeoutMs: 60_000, ...overrides },
  });
  return harness;
}

function client(h: Harness, holder: Credential | null, timeoutMs = 5_000): ControllerClient {
  const c = new ControllerClient({ endpoint: h.server.endpoint, timeoutMs, retryMs: 200, ...(holder ? { credential: holder } : {}) });
  cleanups.push(() => c.close());
  return c;
}

function daemon(h: Harness, host: number, holder = credential(`daemon-${host}`)): HostDaemon {
  // The test registers each replacement itself; the daemon's only waits, as a launcher waits for
  // its checkpoint, until the test ends and removes its directory.
  const marker = join(tenantDir(), "running");
  writeFileSync(marker, "");
  markers.set(host, marker);
  cleanups.push(() => rmSync(dirname(marker), { recursive: true, force: true }));
  const idle = `const fs = require("node:fs"), file = process.argv[1]; fs.writeFileSync(file + ".uid", String(process.getuid())); setInterval(() => fs.existsSync(file) || process.exit(0), 100);`;
  const replacements = new Map([["idle", shellCommand([process.execPath, "-e", idle, marker])]]);
  const d = HostDaemon.start({
    host,
    controller: h.server.endpoint,
    credential: holder,
    stagingBytes: 4 * CHECKPOINT,
    listen: { host: "127.0.0.1", port: 0 },
    heartbeatMs: 100,
    retryMs: 200,
    replacements,
  });
  cleanups.push(() => d.close());
  return d;
}

const refusal = (promise: Promise<unknown>) =>
  promise.then(
    () => expect.fail("the request was answered"),
    (error: unknown) => error,
  );

describe("a controller with a keyring", () => {
  it("answers a keyring key and never a fresh keypair or a plaintext client", async () => {
    const h = await keyedController();
    expect((await client(h, credential("operator-ops")).status()).journalRecords).toBe(1);
    // Holds the controller's public key, as every client does, but its own key is unknown.
    const stranger = { principal: { role: "operator" }, ...curveKeyPair(), serverKey: credential("operator-ops").serverKey } as const;
    expect(await refusal(client(h, stranger, 600).status())).toBeInstanceOf(ControllerTimeoutError);
    expect(await refusal(client(h, null, 600).status())).toBeInstanceOf(ControllerTimeoutError);
    expect(h.logs.some((line) => line.includes("refused a CURVE handshake: its client key is not in the keyring"))).toBe(true);
  });

  it("refuses a message whose auth frame claims another keyring key", async () => {
    const h = await keyedController();
    const own = credential("job-a");
    const claimed = credential("daemon-0");
    const socket = new Dealer({ linger: 0, receiveTimeout: 5_000 });
    cleanups.push(() => socket.close());
    Object.assign(socket, { curveServerKey: own.serverKey, curvePublicKey: own.publicKey, curveSecretKey: own.secretKey });
    socket.connect(h.server.endpoint);
    const frame = JSON.stringify({
      v: PROTOCOL_VERSION,
      type: "daemon.register",
      id: 1,
      host: 0,
      incarnation: INCARNATION,
      stagingBytes: 1,
      endpoint: "tcp://127.0.0.1:1",
    });
    // job-a's MAC under daemon-0's name: only daemon-0's secret key makes daemon-0's MAC.
    const forged = { ...(JSON.parse(signFrame(own, sharedSecret(own, own.serverKey), frame)) as object), key: claimed.publicKey };
    await socket.send([frame, JSON.stringify(forged)]);
    const [reply] = await socket.receive();
    expect(JSON.parse(reply!.toString())).toMatchObject({
      type: "error",
      id: 1,
      code: "forbidden",
      message: expect.stringContaining("MAC does not match daemon-0's key"),
    });
  });

  it("lets a job credential act for its own job only, never for another job or a daemon", async () => {
    const h = await keyedController();
    const a = client(h, credential("job-a"));
    const forbidden = (rule: string) => expect.objectContaining({ code: "forbidden", message: expect.stringContaining(`${rule}:`) });
    expect(await refusal(a.register({ job: "b", group: 0, host: 1 }, dp2))).toEqual(forbidden("job-credential-own-job"));
    expect(await refusal(a.report({ worker: { job: "b", group: 0, host: 1 }, generation: 0, step: 0, stepMs: null, hold: null }))).toEqual(
      expect.objectContaining({
        code: "forbidden",
        message: expect.stringContaining('job-credential-own-job: worker.report for job "b" needs that job\'s credential'),
      }),
    );
    expect(await refusal(a.finish("b"))).toEqual(forbidden("job-credential-own-job"));
    expect(await refusal(a.request({ type: "daemon.register", host: 0, incarnation: INCARNATION, stagingBytes: 1, endpoint: "tcp://127.0.0.1:1" }))).toEqual(
      forbidden("daemon-credential-own-host"),
    );
    expect(await refusal(a.status())).toEqual(forbidden("status-needs-operator"));
    // Job b registers with its own credential meanwhile, untouched by all of that.
    const b = client(h, credential("job-b"));
    const registering = [0, 4].map((host) => b.register({ job: "b", group: 0, host }, dp2, { timeoutMs: 5_000 }));
    expect((await Promise.all(registering)).map((x) => x.nodes)).toEqual([2, 2]);
    expect(await refusal(a.finish("b"))).toBeInstanceOf(ControllerError);
    expect((await client(h, credential("operator-ops")).status()).jobs.map((j) => j.id)).toEqual(["b"]);
  });

  it("tells a job credential that a host is taken, never by which job", async () => {
    const h = await keyedController();
    const b = client(h, credential("job-b"));
    void b.register({ job: "b", group: 0, host: 1 }, dp2, { timeoutMs: 5_000 }).catch(() => {});
    const operator = client(h, credential("operator-ops"));
    await expect.poll(async () => (await operator.status()).jobs.flatMap((j) => j.hosts), patiently).toEqual([1]);
    const a = client(h, credential("job-a"));
    await expect
      .poll(() => refusal(a.register({ job: "a", group: 0, host: 1 }, dp2)), { timeout: 5_000 })
      .toMatchObject({
        code: "conflict",
        message: "host 1 already runs a worker of another job; one worker per host",
      });
    expect(h.logs.join("\n")).toContain('(job "b" has it)');
  });

  it("binds a daemon key to its host, and refuses a second registration of a live host", async () => {
    const h = await keyedController();
    const zero = client(h, credential("daemon-0"));
    const register = (host: number, incarnation: string) =>
      zero.request({ type: "daemon.register", host, incarnation, stagingBytes: 1 << 20, endpoint: "tcp://127.0.0.1:1" });
    expect(await refusal(register(1, INCARNATION))).toMatchObject({
      code: "forbidden",
      message: expect.stringContaining("daemon-credential-own-host: daemon.register for host 1"),
    });
    expect(await refusal(zero.register({ job: "a", group: 0, host: 0 }, dp2))).toMatchObject({ code: "forbidden" });

    await daemon(h, 0).ready();
    // Even the host's own key cannot take over a live registration: no re-routing.
    expect(await refusal(register(0, "f".repeat(32)))).toMatchObject({
      code: "conflict",
      message: expect.stringContaining("host 0 already has a live daemon"),
    });
  });

  it("still migrates a legitimate job end to end: daemons, workers and the replacement all on their own credentials", async () => {
    const h = await keyedController();
    const daemons = Array.from({ length: 8 }, (_, host) => daemon(h, host));
    await Promise.all(daemons.map((d) => d.ready()));
    const jobs = { a: client(h, credential("job-a")), b: client(h, credential("job-b")) };
    const start = async (job: "a" | "b", hosts: number[]) => {
      const workers = hosts.map(
        (host) => new WorkerClient(jobs[job], { job, group: 0, host }, dp2, { checkpointBytes: CHECKPOINT, holdTimeoutMs: 10_000, replacement: "idle" }),
      );
      for (const w of workers) cleanups.push(() => w.close());
      await Promise.all(workers.map((w) => w.register(5_000)));
      return workers;
    };
    const a = await start("a", [0, 4]);
    for (const w of a) expect(await w.barrier(0)).toEqual({ kind: "continue" });
    const b = await start("b", [1, 5]);
    const operator = client(h, credential("operator-ops"));
    const [move] = await plannedMoves(operator);
    if (!move) return expect.fail("expected a planned move");
    const job = move.job as "a" | "b";
    const moving = job === "a" ? a : b;
    const source = moving.find((w) => w.worker.host === move.from)!;
    const stayer = moving.find((w) => w.worker.host !== move.from)!;
    // Barriers answer on the host: the workers hold at the stop only once its order reached them.
    await expect.poll(() => moving.every((w) => w.stop !== null), { timeout: 10_000 }).toBe(true);
    const stopStep = source.stop!.step;
    expect(stayer.stop?.step).toBe(stopStep);
    expect((await operator.status()).migrations[0]?.stopStep).toBe(stopStep);

    const stayerBarrier = stayer.barrier(stopStep);
    const out = await source.barrier(stopStep);
    if (out.kind !== "migrate-out") return expect.fail(`expected migrate-out, got ${JSON.stringify(out)}`);
    // The ticket names the endpoint the destination's daemon registered under its own key.
    expect(out.endpoint).toBe(daemons[move.to]!.endpoint);
    const buffer = StagingBuffer.create({ size: CHECKPOINT });
    cleanups.push(() => buffer.free());
    randomFillSync(buffer.bytes());
    await send({ ticket: ticketFor(out.endpoint, out.token, CHECKPOINT), buffer, offset: 0 });
    expect(await source.barrier(stopStep)).toMatchObject({ kind: "stop" });

    // The other job's credential cannot take the replacement's place, even with the token.
    const other = job === "a" ? jobs.b : jobs.a;
    expect(await refusal(other.register({ job, group: 0, host: move.to }, dp2, { token: out.token }))).toMatchObject({ code: "forbidden" });
    const replacement = new WorkerClient(jobs[job], { job, group: 0, host: move.to }, dp2, { token: out.token });
    cleanups.push(() => replacement.close());
    expect(await replacement.register(5_000)).toMatchObject({ generation: 1, resumeStep: stopStep });
    expect(await stayerBarrier).toMatchObject({ kind: "reconfigure" });
    // The move is done once every worker of the job reports the new generation.
    await expect.poll(async () => (await operator.status()).migrations[0]?.state, { timeout: 10_000 }).toBe("done");
    // Its replacement ran as the job's own user.
    expect(readFileSync(`${markers.get(move.to)}.uid`, "utf8")).toBe(String(TENANT?.uid ?? process.getuid!()));
  });
});

/**
 * A CURVE connection admitted under `holder`'s key that sends `count` job.finish requests,
 * each with the auth frame `sign` makes, and counts the replies.
 */
function flood(h: Harness, holder: Credential, count: number, sign: (frame: string) => string) {
  const socket = new Dealer({ linger: 0 });
  cleanups.push(() => socket.close());
  Object.assign(socket, { curveServerKey: holder.serverKey, curvePublicKey: holder.publicKey, curveSecretKey: holder.secretKey });
  socket.connect(h.server.endpoint);
  const counted = { replies: 0, codes: new Set<string>() };
  void (async () => {
    for await (const [reply] of socket) {
      counted.replies += 1;
      counted.codes.add((JSON.parse(reply!.toString()) as { code: string }).code);
    }
  })().catch(() => undefined);
  const sent = (async () => {
    for (let id = 1; id <= count; id++) {
      const frame = JSON.stringify({ v: PROTOCOL_VERSION, type: "job.finish", id, job: "a" });
      await socket.send([frame, sign(frame)]);
    }
  })();
  return { counted, sent };
}

describe("the rate limit of a controller with a keyring", () => {
  // No refill to speak of within a test: a key gets its burst, and no more.
  const rateLimits = { perSecond: 0.001, burst: 10, clients: 100 };

  it("holds a key to its rate across all its connections, while another key's requests pass", async () => {
    const h = await keyedController({ rateLimits });
    const a = credential("job-a");
    const secret = sharedSecret(a, a.serverKey);
    // Eight connections, each within its own connection's burst, all on job a's key.
    const floods = Array.from({ length: 8 }, () => flood(h, a, rateLimits.burst, (frame) => signFrame(a, secret, frame)));
    await Promise.all(floods.map((f) => f.sent));
    const replies = () => floods.reduce((sum, f) => sum + f.counted.replies, 0);
    // Every request is answered or dropped; wait until all 80 are one or the other.
    await expect.poll(() => replies() + h.server.dropped, patiently).toBe(8 * rateLimits.burst);
    expect(replies()).toBe(rateLimits.burst);
    expect(h.server.dropped).toBe(7 * rateLimits.burst);
    expect(h.logs.some((line) => line.includes("job-a is over its request rate across its connections"))).toBe(true);
    await expect(client(h, credential("job-b")).finish("b")).rejects.toMatchObject({ code: "unknown_job" });
  });

  it("charges a request whose MAC fails to its connection, never to the key it names", async () => {
    const h = await keyedController({ rateLimits });
    const [a, b] = [credential("job-a"), credential("job-b")];
    // Admitted under job a's key, claiming job b's: as many as job b's whole burst.
    const forged = flood(h, a, rateLimits.burst, () => JSON.stringify({ key: b.publicKey, mac: "0".repeat(64) }));
    await forged.sent;
    await expect.poll(() => forged.counted.replies, patiently).toBe(rateLimits.burst);
    expect([...forged.counted.codes]).toEqual(["forbidden"]);
    await expect(client(h, b).finish("b")).rejects.toMatchObject({ code: "unknown_job" });
    expect(h.server.dropped).toBe(0);
  });
});

describe("an operator", () => {
  it("ends a job whose key was revoked, with `monkeytree job finish`", async () => {
    const h = await keyedController();
    const a = client(h, credential("job-a"));
    const registered = [0, 4].map((host) => a.register({ job: "a", group: 0, host }, dp2, { timeoutMs: 5_000 }));
    expect((await Promise.all(registered)).map((x) => x.nodes)).toEqual([2, 2]);
    const keyring = loadKeyring(keys);
    expect(h.server.reloadKeyring({ ...keyring, clients: keyring.clients.filter((c) => c.name !== "job-a") })).toEqual({ added: [], removed: ["job-a"] });
    expect(await refusal(a.finish("a"))).toMatchObject({ code: "forbidden", message: expect.stringContaining("not in the controller's keyring") });
    const operator = join(keys, "operator-ops.json");
    const ended = await runCli("job", "finish", "--job", "a", "--connect", h.server.endpoint, "--credentials", operator);
    expect(ended, ended.stderr).toMatchObject({ code: 0, stdout: 'job "a" finished\n' });
    expect((await client(h, credential("operator-ops")).status()).jobs).toEqual([]);
    // A job credential still ends only its own job.
    const other = await runCli("job", "finish", "--job", "a", "--connect", h.server.endpoint, "--credentials", join(keys, "job-b.json"));
    expect(other).toMatchObject({ code: 3, stderr: expect.stringContaining("job-credential-own-job") });
  });

  it("refuses a reload that changes the controller's keypair, keeping the keyring in use", async () => {
    const h = await keyedController();
    const keyring = loadKeyring(keys);
    expect(() => h.server.reloadKeyring({ ...keyring, ...curveKeyPair(), clients: [] })).toThrow("the keyring's controller keypair differs");
    expect((await client(h, credential("operator-ops")).status()).journalRecords).toBeGreaterThan(0);
  });
});

describe("secret files", () => {
  it("refuses a keyring or a credential its group or others may read, naming the chmod", async () => {
    const dir = tempDir();
    cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
    expect((await runCli("keys", "--dir", dir, "--job", "a", "--operator", "ops")).code).toBe(0);
    const keyringPath = join(dir, "controller.json");
    chmodSync(keyringPath, 0o640);
    const controller = await runCli("controller", "--keys", dir, "--journal", join(dir, "journal"));
    expect(controller).toMatchObject({
      code: 2,
      stderr: expect.stringContaining(
        `keyring ${keyringPath}: it holds secret keys but its group or others may read it (mode 0640); run \`chmod 600 ${keyringPath}\``,
      ),
    });
    const operator = join(dir, "operator-ops.json");
    chmodSync(operator, 0o604);
    const status = await runCli("status", "--credentials", operator, "--timeout", "0.5");
    expect(status).toMatchObject({
      code: 2,
      stderr: expect.stringContaining(
        `credential ${operator}: it holds secret keys but its group or others may read it (mode 0604); run \`chmod 600 ${operator}\``,
      ),
    });
    const job = join(dir, "job-a.json");
    chmodSync(job, 0o644);
    const launch = await runCli("launch", "--job", "a", "--host", "0", "--dp", "1", "--credentials", job, "--", "true");
    expect(launch).toMatchObject({ code: 2, stderr: expect.stringContaining(`run \`chmod 600 ${job}\``) });
  });
});
