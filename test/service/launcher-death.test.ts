import { afterEach, describe, expect, it } from "vitest";
import { join } from "node:path";
import { ANYONE } from "../../controller/service/authorization.ts";
import { Controller } from "../../controller/service/controller.ts";
import { Journal } from "../../controller/service/journal.ts";
import { DEFAULT_LOST_JOB_GRACE_MS, DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS } from "../../controller/service/sessions.ts";
import { ProcessGroup, WORKER, type Managed } from "../../cli/demo/processes.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import { PROTOCOL_VERSION, type Reply, type Request, type StatusReport } from "../../sdk/contract/protocol/index.ts";
import { patiently } from "../helpers/wait.ts";
import { RecordingHosts } from "./doubles.ts";
import { closeControllersAfterEach, connect, SMALL, startController, tempDirsPerTest } from "./harness.ts";

/**
 * A job whose launchers died: their workers go silent, status shows them lost, and the job
 * ends in bounded time, freeing its hosts. Jobs sit on hosts 0 and 1, one rack, so no plan
 * (and no planner thread) comes into it.
 */

const fresh = tempDirsPerTest();
closeControllersAfterEach();
const teardown: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const step of teardown.splice(0).reverse()) await step();
});

type Body = Request extends infer R ? (R extends Request ? Omit<R, "v" | "id"> : never) : never;
const dp2 = { tp: 1, pp: 1, dp: 2 };
const worker = (job: string, host: number) => ({ job, group: 0, host });
/** A launcher's timed report: the worker's progress, and the controller's sign that it lives. */
const report = (job: string, host: number, step: number | null = null) =>
  ({ type: "worker.report", worker: worker(job, host), generation: 0, step, stepMs: null, hold: null }) as const;
const TIMEOUT = DEFAULT_WORKER_HEARTBEAT_TIMEOUT_MS;
const GRACE = DEFAULT_LOST_JOB_GRACE_MS;

/** The controller without sockets, on a clock the test moves; its ticks are the server's timer. */
function open(dir = fresh()) {
  const now = { t: 1_000 };
  const { journal, state } = Journal.open(dir, { kind: "config", topology: SMALL, lambda: 1, podLambda: null }, () => now.t);
  const hosts = new RecordingHosts();
  const controller = new Controller({ journal, state, transport: hosts, launcher: hosts, clock: () => now.t, logger: createLogger("controller", () => {}) });
  teardown.push(() => controller.close());
  const replies = new Map<number, Reply>();
  let nextId = 1;
  const send = (body: Body): Reply | undefined => {
    const id = nextId++;
    controller.handle(new Uint8Array([1]), { ...body, v: PROTOCOL_VERSION, id } as Request, ANYONE);
    for (const { reply } of controller.drain()) replies.set(reply.id, reply);
    return replies.get(id);
  };
  return {
    controller,
    send,
    /** Moves the clock on by `ms`, of which the controller was deaf for `deafMs`, and ticks. */
    pass(ms: number, deafMs = 0) {
      now.t += ms;
      controller.tick(deafMs);
    },
    job(id: string): StatusReport["jobs"][number] | undefined {
      const report = send({ type: "status" });
      if (report?.type !== "status.report") throw new Error(`expected a status report, got ${JSON.stringify(report)}`);
      return report.jobs.find((j) => j.id === id);
    },
    /** Starts job `id` on `hosts`, each worker reporting once. */
    start(id: string, hosts: readonly number[]) {
      for (const host of hosts) send({ type: "worker.register", worker: worker(id, host), parallelism: dp2, checkpointBytes: 8 });
      for (const host of hosts) expect(send(report(id, host))).toMatchObject({ type: "worker.order", worker: worker(id, host), order: { kind: "run" } });
    },
  };
}

describe("a job whose launchers died, on the controller's clock", () => {
  it("shows a worker silent for the heartbeat timeout as lost, and ends the job when all are lost for the grace", () => {
    const c = open();
    c.start("a", [0, 1]);
    c.pass(TIMEOUT - 1);
    expect(c.job("a")).not.toHaveProperty("lost");
    c.pass(1);
    expect(c.job("a")).toMatchObject({ started: true, lost: [0, 1] });
    c.pass(GRACE - 1);
    expect(c.job("a")).toMatchObject({ lost: [0, 1] });
    c.pass(1);
    expect(c.job("a")).toBeUndefined();
    expect(c.controller.durable.finished).toEqual(["a"]);
    // A launcher that was only cut off is told the job ended, and its hosts take another job.
    expect(c.send(report("a", 0, 3))).toMatchObject({ type: "worker.order", order: { kind: "stop", reason: "job a finished" } });
    c.start("b", [0, 1]);
    expect(c.job("b")).toMatchObject({ started: true, hosts: [0, 1] });
  });

  it("keeps alive a worker that reports, even with no step to tell, and takes back one heard again", () => {
    const c = open();
    c.start("a", [0, 1]);
    for (let beat = 0; beat < 40; beat++) {
      c.pass(TIMEOUT / 2);
      // A launcher paused before its first barrier still reports on its timer.
      c.send(report("a", 0));
    }
    // Host 1's launcher went silent long ago; host 0's still reports, so the job runs on.
    expect(c.job("a")).toMatchObject({ started: true, lost: [1] });
    expect(c.send(report("a", 1, 0))).toMatchObject({ type: "worker.order", order: { kind: "run" } });
    c.pass(0);
    expect(c.job("a")).not.toHaveProperty("lost");
  });

  it("never declares lost a worker never heard reporting: silence after registering alone proves nothing", () => {
    const c = open();
    for (const host of [0, 1]) c.send({ type: "worker.register", worker: worker("a", host), parallelism: dp2, checkpointBytes: 8 });
    c.pass(10 * (TIMEOUT + GRACE));
    expect(c.job("a")).toMatchObject({ started: true });
    expect(c.job("a")).not.toHaveProperty("lost");
  });

  it("does not count the time the controller itself was deaf", () => {
    const c = open();
    c.start("a", [0, 1]);
    c.pass(TIMEOUT + GRACE, TIMEOUT + GRACE);
    expect(c.job("a")).not.toHaveProperty("lost");
  });

  it("ends a job the journal restored that no worker speaks for after a restart: it finished while the controller was down", () => {
    const dir = fresh();
    const before = open(dir);
    before.start("a", [0, 1]);
    before.start("b", [2, 3]);
    const c = open(dir);
    expect([c.job("a"), c.job("b")]).toMatchObject([{ started: true }, { started: true }]);
    c.pass(TIMEOUT);
    // Job b's launchers rejoin the restarted controller; job a's ended during the outage.
    expect(c.send(report("b", 2, 7))).toMatchObject({ type: "worker.order", order: { kind: "run" } });
    c.pass(GRACE - 1);
    expect(c.job("a")).toMatchObject({ started: true });
    c.pass(1);
    expect(c.job("a")).toBeUndefined();
    expect(c.controller.durable.finished).toEqual(["a"]);
    expect(c.job("b")).toMatchObject({ started: true, hosts: [2, 3] });
    c.pass(10 * (TIMEOUT + GRACE), 10 * (TIMEOUT + GRACE));
    expect(c.job("b")).toMatchObject({ started: true });
  });

  it("refuses reports of a job still registering and of an unknown one, changing nothing", () => {
    const c = open();
    const register = { type: "worker.register", worker: worker("a", 0), parallelism: dp2, checkpointBytes: 8 } as const;
    c.send(register);
    expect(c.send(report("a", 0))).toMatchObject({ type: "error", code: "unknown_job", message: expect.stringContaining('job "a" has not started') });
    expect(c.send(report("nobody", 3))).toMatchObject({ type: "error", code: "unknown_job", message: expect.stringContaining('job "nobody" is not known') });
    // Its launcher resends the registration until it is answered, as a client does every second.
    for (let passed = 0; passed < TIMEOUT + GRACE; passed += 1_000) {
      c.pass(1_000);
      c.send(register);
    }
    expect(c.job("a")).toMatchObject({ started: false, hosts: [0] });
    expect(c.controller.durable.jobs.size).toBe(0);
  });

  it("drops a registration its launcher stopped resending, freeing its host", () => {
    const c = open();
    c.send({ type: "worker.register", worker: worker("a", 0), parallelism: dp2, checkpointBytes: 8 });
    c.pass(TIMEOUT - 1);
    expect(c.job("a")).toMatchObject({ started: false, hosts: [0] });
    c.pass(1);
    expect(c.job("a")).toBeUndefined();
  });
});

describe("a job whose launcher processes are killed", () => {
  // Short enough for a test, long against the reports: a launcher starved of the CPU for seconds
  // on a loaded machine still reports well inside it.
  const timeoutMs = 5_000;
  const graceMs = 5_000;
  const reportMs = 100;

  it("shows each killed launcher's worker lost in status, then ends the job", async () => {
    const dir = fresh();
    const h = await startController({ overrides: { workerHeartbeatTimeoutMs: timeoutMs, lostJobGraceMs: graceMs } });
    const client = connect(h);
    const group = new ProcessGroup(dir);
    teardown.push(() => group.stopAll(1_000));
    // Each pauses before its second iteration for good: after that it only reports, on its timer.
    const launchers: Managed[] = [0, 1].map((host) =>
      group.start(`worker-${host}`, [
        ...WORKER,
        "--controller",
        h.server.endpoint,
        "--job",
        "a",
        "--host",
        String(host),
        "--tp",
        "1",
        "--dp",
        "2",
        "--state-bytes",
        "65536",
        "--pause-at",
        "1",
        "--resume-when-exists",
        join(dir, "never"),
        "--report-ms",
        String(reportMs),
      ]),
    );
    for (const launcher of launchers) await group.waitFor(launcher, /node rank \d of 2/, patiently.timeout);
    const job = async () => (await client.status()).jobs.find((j) => j.id === "a");

    // Paused past the timeout, they are not lost: the reports, not the barriers, keep them known.
    for (const until = Date.now() + timeoutMs * 1.5; Date.now() < until; await new Promise((resolve) => setTimeout(resolve, 250))) {
      expect(await job()).toMatchObject({ started: true, hosts: [0, 1] });
      expect(await job()).not.toHaveProperty("lost");
    }

    group.kill(launchers[0]!, "SIGKILL");
    await expect.poll(async () => (await job())?.lost, patiently).toEqual([0]);
    group.kill(launchers[1]!, "SIGKILL");
    await expect.poll(async () => (await job())?.lost, patiently).toEqual([0, 1]);
    await expect.poll(job, patiently).toBeUndefined();
    const { events } = await client.events();
    expect(events.map((e) => e.event)).toContain("job-finished");
    expect(h.logs.join("\n")).toMatch(/every worker of job a lost, the last heard \d+ ms ago: its launchers are gone; hosts 0, 1 are free/);
  }, 180_000);
});
