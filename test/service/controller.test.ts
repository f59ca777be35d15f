import { rmSync } from "node:fs";
import { afterEach, describe, expect, it } from "vitest";
import { ANYONE } from "../../controller/service/authorization.ts";
import { Controller } from "../../controller/service/controller.ts";
import { Journal } from "../../controller/service/journal.ts";
import { createLogger } from "../../sdk/contract/log.ts";
import { applyRecord, type RecordBody } from "../../controller/service/state.ts";
import { PROTOCOL_VERSION, type Reply, type Request } from "../../sdk/contract/protocol/index.ts";
import type { Hold } from "../../sdk/contract/protocol/worker.ts";
import { RecordingHosts } from "./doubles.ts";
import { SMALL, tempDir } from "./harness.ts";

const config: Extract<RecordBody, { kind: "config" }> = { kind: "config", topology: SMALL, lambda: 1, podLambda: null };
const dirs: string[] = [];
afterEach(() => dirs.splice(0).forEach((d) => rmSync(d, { recursive: true, force: true })));

type Body = Request extends infer R ? (R extends Request ? Omit<R, "v" | "id"> : never) : never;

/** The controller without sockets: requests go in, replies are collected by request id. */
async function open(dir: string, now = { t: 1_000 }) {
  const { journal, state } = Journal.open(dir, config, () => now.t);
  const hosts = new RecordingHosts();
  const controller = new Controller({ journal, state, transport: hosts, launcher: hosts, clock: () => now.t, logger: createLogger("controller", () => {}) });
  const replies = new Map<number, Reply>();
  let nextId = 1;
  const drain = () => {
    for (const { reply } of controller.drain()) replies.set(reply.id, reply);
  };
  return {
    controller,
    journal,
    hosts,
    /** Sends a request; returns a function that reads its reply (undefined while held). */
    send(body: Body) {
      const id = nextId++;
      controller.handle(new Uint8Array([1]), { ...body, v: PROTOCOL_VERSION, id } as Request, ANYONE);
      drain();
      return () => {
        drain();
        return replies.get(id);
      };
    },
  };
}

const dp2 = { tp: 1, pp: 1, dp: 2 };
const worker = (job: string, host: number, group = 0) => ({ job, group, host });
const report = (w: { job: string; group: number; host: number }, step: number, generation: number, hold: Hold | null = null) =>
  ({ type: "worker.report", worker: w, generation, step, stepMs: null, hold }) as const;

describe("controller logic", () => {
  it("ranks pipeline stages in ring order: each stage's hosts get consecutive node ranks", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const c = await open(dir);
    const parallelism = { tp: 8, pp: 2, dp: 2 };
    const replies = [
      [5, 0],
      [1, 0],
      [6, 1],
      [2, 1],
    ].map(([host, group]) => c.send({ type: "worker.register", worker: worker("llm", host!, group), parallelism, checkpointBytes: 0 }));
    const assignments = replies.map((r) => {
      const reply = r();
      if (reply?.type !== "worker.registered") throw new Error(`expected an assignment, got ${JSON.stringify(reply)}`);
      return reply.assignment;
    });
    expect(assignments.map((a) => [a.host, a.group, a.nodeRank, a.ringOrder])).toEqual([
      [5, 0, 1, [1, 5]],
      [1, 0, 0, [1, 5]],
      [6, 1, 3, [2, 6]],
      [2, 1, 2, [2, 6]],
    ]);
    expect(assignments.every((a) => a.nodes === 4 && a.masterHost === 1)).toBe(true);
  });

  it("frees a finished job's hosts for the next job", async () => {
    const dir = tempDir();
    dirs.push(dir);
    const c = await open(dir);
    for (const host of [0, 4]) c.send({ type: "worker.register", worker: worker("a", host), parallelism: dp2, checkpointBytes: 8 });
    const before = c.controller.durable.records;
    expect(c.send({ type: "job.finish", job: "a" })()).toMatchObject({ type: "job.finished", job: "a" });
    expect(c.controller.durable.jobs.size).toBe(0);
    expect(c.controller.durable.records).toBe(before + 1);
    // A finish resent after a lost reply is answered again, and changes nothing.
    expect(c.send({ type: "job.finish", job: "a" })()).toMatchObject({ type: "job.finished", job: "a" });
    expect(c.controller.durable.records).toBe(before + 1);
    expect(c.send({ type: "job.finish", job: "never" })()).toMatchObject({ type: "error", code: "unknown_job" });
    // Another worker's last report, still on its way when the first launcher finished the job, is told to stop.
    expect(c.send(report(worker("a", 4), 9, 0))()).toMatchObject({ type: "worker.order", order: { kind: "stop", reason: "job a finished" } });
    // Host 0 is free again: the registration is accepted and waits for the job's second worker.
    expect(c.send({ type: "worker.register", worker: worker("b", 0), parallelism: dp2, checkpointBytes: 8 })()).toBeUndefined();
    expect(c.send({ type: "worker.register", worker: worker("b", 4), parallelism: dp2, checkpointBytes: 8 })()).toMatchObject({ type: "worker.registered" });
  });

  it("after a restart, completes a move that was resuming once every worker has the new assignment", async () => {
    const dir = tempDir();
    dirs.push(dir);
    // Journal: job a on hosts 0 and 4, moved 4 → 1 and committed, the job re-forming.
    const { journal, state: initial } = Journal.open(dir, config, () => 1);
    let state = initial;
    const write = (body: RecordBody) => (state = applyRecord(state, journal.append(body)));
    write({ kind: "job-started", job: "a", rings: 1, parallelism: dp2, groups: [[0, 4]], checkpointBytes: { "0": 8, "4": 8 }, replacement: null });
    write({ kind: "plan", plan: "p0", moves: [{ job: "a", group: 0, from: 4, to: 1, step: 0 }] });
    const m = state.migrations.get("p0/0")!;
    write({ kind: "migration", migration: { ...m, state: "committing", stopStep: 5, token: "t" } });
    write({ kind: "migration", migration: { ...m, state: "resuming", stopStep: 5, token: "t" } });
    journal.close();

    const c = await open(dir);
    expect(c.hosts.spawned).toEqual([]);
    // The replacement already had its assignment (generation 1); the other worker did not.
    expect(c.send(report(worker("a", 1), 5, 1))()).toMatchObject({ order: { kind: "run" } });
    expect(c.controller.durable.migrations.get("p0/0")?.state).toBe("resuming");
    const stale = c.send(report(worker("a", 0), 5, 0, { stop: "p0/step0", step: 5, phase: "sealed" }))();
    expect(stale).toMatchObject({ order: { kind: "reconfigure", assignment: { generation: 1, ringOrder: [0, 1], nodeRank: 0 } } });
    expect(c.controller.durable.migrations.get("p0/0")?.state).toBe("resuming");
    // Once it runs with the new assignment, the move is done.
    expect(c.send(report(worker("a", 0), 5, 1))()).toMatchObject({ order: { kind: "run" } });
    expect(c.controller.durable.migrations.get("p0/0")?.state).toBe("done");
    // The old source is told to stop.
    expect(c.send(report(worker("a", 4), 5, 0))()).toMatchObject({ order: { kind: "stop" } });
  });
});
