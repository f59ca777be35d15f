import { describe, expect, it } from "vitest";
import { launching, LaunchError, transition, type LauncherEvent, type LauncherState, type Transition } from "../../sdk/client/launch/launcher-state.ts";
import type { Assignment, Directive } from "../../sdk/contract/protocol/worker.ts";

const T0 = 1_000_000;

const assignment: Assignment = {
  job: "a",
  group: 0,
  host: 3,
  nodeRank: 1,
  nodes: 2,
  masterHost: 0,
  masterAddress: "10.0.0.1",
  ringOrder: [0, 3],
  generation: 0,
  resumeStep: null,
};
const reformed: Assignment = { ...assignment, nodeRank: 0, ringOrder: [3, 5], generation: 1 };
const migrateOut: Extract<Directive, { kind: "migrate-out" }> = {
  kind: "migrate-out",
  migration: "p0/0",
  to: 5,
  endpoint: "tcp://10.0.0.5:7000",
  token: "tk",
  step: 7,
};
const refusal = new Error("host 99 is out of range");

/** Feeds events one by one at 10 ms intervals from T0, and returns every transition. */
function run(events: LauncherEvent[], start: LauncherState = launching(2)): Transition[] {
  let state = start;
  let now = T0;
  return events.map((event) => {
    now += 10;
    const t = transition(state, event, now);
    state = t.state;
    return t;
  });
}

/** The state after `events`. */
const after = (events: LauncherEvent[], start?: LauncherState): LauncherState => run(events, start).at(-1)!.state;

const info = (text: string) => ({ level: "info", text });

const registering = launching(2);
const starting = after([{ type: "spawned", pid: 7 }]);
const running = after([{ type: "registered", assignment }], starting);
const aborting = after([{ type: "refused", error: refusal }], starting);
const finishing = after([{ type: "exited", code: 0 }], running);
const exited = after([{ type: "finished" }], finishing);
const failed = after([{ type: "exited", code: 1 }], starting);

describe("the launcher's state machine from torchrun's start to its end", () => {
  it("walks registering → starting → running → finishing → exited for a job trained to its end", () => {
    const steps = run([{ type: "spawned", pid: 7 }, { type: "registered", assignment }, { type: "exited", code: 0 }, { type: "finished" }]);
    expect(steps.map((t) => t.state.phase)).toEqual(["starting", "running", "finishing", "exited"]);
    expect(steps.map((t) => t.actions)).toEqual([[], [], [{ type: "finish" }], [{ type: "end", code: 0 }]]);
    expect(steps.map((t) => t.log)).toEqual([
      [info("registering → starting: torchrun started (pid 7) with 2 local processes; registering")],
      [info("starting → running: node rank 1 of 2, generation 0")],
      // The controller hears of the end before the log says so.
      [],
      [info("running → exited: training ended; the job is finished")],
    ]);
    expect(steps[1]?.state).toEqual({ phase: "running", assignment, stopped: false, saving: null, progress: { logged: -1, reformedAt: null } });
    expect(steps[3]?.state).toEqual({ phase: "exited", code: 0, why: "training ended; the job is finished" });
    expect(transition(registering, { type: "spawned", pid: undefined }, T0).log).toEqual([
      info("registering → starting: torchrun started (pid ?) with 2 local processes; registering"),
    ]);
  });

  it("ends with torchrun's code, without finishing the job, when torchrun failed or a process was told to stop", () => {
    expect(run([{ type: "exited", code: 1 }], running)[0]).toEqual({
      state: { phase: "exited", code: 1, why: "torchrun failed with 1" },
      actions: [{ type: "end", code: 1 }],
      log: [info("running → exited: torchrun failed with 1")],
    });
    const stopped = after([{ type: "stop" }], running);
    expect(stopped).toEqual({ ...running, stopped: true });
    for (const code of [0, 143]) {
      expect(run([{ type: "exited", code }], stopped)[0]).toEqual({
        state: { phase: "exited", code, why: "stopped" },
        actions: [{ type: "end", code }],
        log: [info("running → exited: stopped")],
      });
    }
  });

  it("takes a failure of torchrun's process as its end with 127, saying what failed first", () => {
    const failure: LauncherEvent = { type: "spawn-failed", program: "torchrun", message: "spawn torchrun ENOENT" };
    const couldNot = { level: "error", text: "could not start torchrun: spawn torchrun ENOENT" };
    const early = transition(registering, failure, T0);
    expect(early.state).toEqual({ phase: "failed", error: new LaunchError("torchrun exited with 127 before the job took this host's worker") });
    expect(early.actions).toEqual([{ type: "fail", error: expect.any(LaunchError) }]);
    expect(early.log).toEqual([couldNot]);
    expect(transition(running, failure, T0)).toEqual({
      state: { phase: "exited", code: 127, why: "torchrun failed with 127" },
      actions: [{ type: "end", code: 127 }],
      log: [couldNot, info("running → exited: torchrun failed with 127")],
    });
    expect(transition(aborting, failure, T0)).toEqual({
      state: { phase: "failed", error: refusal },
      actions: [{ type: "fail", error: refusal }],
      log: [couldNot],
    });
  });

  it("fails when torchrun exits before the registration is answered, whatever the controller answers later", () => {
    for (const start of [registering, starting]) {
      const t = transition(start, { type: "exited", code: 3 }, T0);
      expect(t.state).toEqual({ phase: "failed", error: new LaunchError("torchrun exited with 3 before the job took this host's worker") });
      expect(t.actions).toEqual([{ type: "fail", error: expect.any(LaunchError) }]);
      expect(t.log).toEqual([]);
    }
    for (const late of [
      { type: "registered", assignment },
      { type: "refused", error: refusal },
    ] as const) {
      expect(transition(failed, late, T0)).toEqual({ state: failed, actions: [], log: [] });
    }
  });

  it("terminates torchrun when the registration is refused, and fails with the refusal once torchrun exited", () => {
    const refused = transition(starting, { type: "refused", error: refusal }, T0);
    expect(refused).toEqual({ state: { phase: "aborting", error: refusal }, actions: [{ type: "terminate", signal: "SIGTERM" }], log: [] });
    expect(transition(refused.state, { type: "exited", code: 143 }, T0)).toEqual({
      state: { phase: "failed", error: refusal },
      actions: [{ type: "fail", error: refusal }],
      log: [],
    });
    // A registration that cannot even be sent fails before torchrun's start is seen, which then changes nothing.
    const early = transition(registering, { type: "refused", error: refusal }, T0);
    expect(early.state).toEqual({ phase: "aborting", error: refusal });
    expect(early.actions).toEqual([{ type: "terminate", signal: "SIGTERM" }]);
    expect(transition(early.state, { type: "spawned", pid: 7 }, T0)).toEqual({ state: early.state, actions: [], log: [] });
  });

  it("aborts a registration whose master runs no daemon, naming the command that starts one", () => {
    const t = transition(starting, { type: "registered", assignment: { ...assignment, masterHost: 4, masterAddress: null } }, T0);
    const error = new LaunchError("the job's master, host 4, runs no monkeytree daemon, so its address is unknown; start `monkeytree daemon --host 4` there");
    expect(t).toEqual({ state: { phase: "aborting", error }, actions: [{ type: "terminate", signal: "SIGTERM" }], log: [] });
  });
});

describe("the launcher's state machine and its local processes", () => {
  it("lets a replacement register once every local process waits at attach, each counted once", () => {
    const steps = run([
      { type: "attached", localRank: 1 },
      { type: "attached", localRank: 1 },
      { type: "spawned", pid: 7 },
      { type: "attached", localRank: 0 },
    ]);
    expect(steps.map((t) => t.actions)).toEqual([[], [], [], [{ type: "all-attached" }]]);
    expect(steps.map((t) => (t.state.phase === "starting" || t.state.phase === "registering" ? [...t.state.attached] : null))).toEqual([[1], [1], [1], [1, 0]]);
    // Pure: the state fed in is left as it was.
    expect(registering).toEqual(launching(2));
    // Once the registration is answered, no attach is waited for.
    expect(transition(steps[3]!.state, { type: "attached", localRank: 0 }, T0).actions).toEqual([]);
    expect(transition(running, { type: "attached", localRank: 0 }, T0)).toEqual({ state: running, actions: [], log: [] });
  });

  it("counts a move's checkpoint from migrate-out and sends it once every local process saved, on a fixed clock", () => {
    const steps = run(
      [
        { type: "migrate-out" },
        { type: "saved", bytes: 4096 },
        { type: "migrate-out" },
        { type: "saved", bytes: 2048 },
        { type: "all-saved", migrateOut, bytes: 8192 },
      ],
      running,
    );
    // The first local process told to save sets the time; the others leave it.
    expect(steps[2]?.state).toMatchObject({ saving: { asked: T0 + 10, written: 4096 } });
    expect(steps.slice(0, 4).every((t) => t.actions.length === 0 && t.log.length === 0)).toBe(true);
    expect(steps[4]).toEqual({
      state: { ...running, saving: null },
      actions: [{ type: "send", migrateOut, at: T0 + 50 }],
      log: [info("migration p0/0: sending 8192 bytes to tcp://10.0.0.5:7000; every local process saved, 6144 bytes in all, 0.040 s after migrate-out")],
    });
    // The host agent may have held the processes since before this launcher saw migrate-out.
    expect(transition(running, { type: "all-saved", migrateOut, bytes: 8192 }, T0).log).toEqual([
      info("migration p0/0: sending 8192 bytes to tcp://10.0.0.5:7000; every local process saved, 0 bytes in all"),
    ]);
    // Outside a move, a process's saved counts for nothing.
    expect(transition(running, { type: "saved", bytes: 4096 }, T0)).toEqual({ state: running, actions: [], log: [] });
  });

  it("says how the checkpoint went, in whatever state its send ends", () => {
    const sent: LauncherEvent = { type: "checkpoint-sent", migrateOut, at: T0, outcome: { bytes: 8192, transport: "tcp" } };
    const lost: LauncherEvent = { type: "checkpoint-sent", migrateOut, at: T0, outcome: { failure: "connection refused" } };
    for (const state of [running, finishing, exited]) {
      expect(transition(state, sent, T0 + 1_500)).toEqual({ state, actions: [], log: [info("migration p0/0: sent 8192 bytes in 1.500 s over tcp")] });
      expect(transition(state, lost, T0 + 1_500)).toEqual({
        state,
        actions: [],
        log: [{ level: "warn", text: "migration p0/0: the checkpoint did not reach host 5: connection refused" }],
      });
    }
  });

  it("logs the first barrier and every 50th at info, the others at debug, and when training resumed after a re-formation", () => {
    const steps = run(
      [
        { type: "barrier", step: 0 },
        { type: "barrier", step: 1 },
        { type: "barrier", step: 1 },
        { type: "barrier", step: 50 },
      ],
      running,
    );
    expect(steps.map((t) => t.log)).toEqual([[info("barrier 0 reached")], [{ level: "debug", text: "barrier 1 reached" }], [], [info("barrier 50 reached")]]);
    const told = transition(steps[3]!.state, { type: "reconfigure", assignment: reformed }, T0);
    expect(told).toEqual({ state: { ...running, assignment: reformed, progress: { logged: 50, reformedAt: T0 } }, actions: [], log: [] });
    const resumed = transition(told.state, { type: "barrier", step: 51 }, T0 + 1_234);
    expect(resumed.log).toEqual([
      { level: "debug", text: "barrier 51 reached" },
      info("training resumed: barrier 51 reached 1.234 s after the group was told to re-form"),
    ]);
    expect(resumed.state).toMatchObject({ progress: { logged: 51, reformedAt: null } });
    expect(transition(resumed.state, { type: "barrier", step: 52 }, T0 + 2_000).log).toEqual([{ level: "debug", text: "barrier 52 reached" }]);
    // Barriers passed just before torchrun's clean exit are still told.
    expect(transition(finishing, { type: "barrier", step: 0 }, T0)).toEqual({
      state: { phase: "finishing", progress: { logged: 0, reformedAt: null } },
      actions: [],
      log: [info("barrier 0 reached")],
    });
  });
});

const PHASES = ["registering", "starting", "running", "aborting", "finishing", "exited", "failed"] as const;
const STATES: Record<(typeof PHASES)[number], LauncherState> = { registering, starting, running, aborting, finishing, exited, failed };

const EVENTS: Record<LauncherEvent["type"], LauncherEvent> = {
  attached: { type: "attached", localRank: 0 },
  spawned: { type: "spawned", pid: 7 },
  "spawn-failed": { type: "spawn-failed", program: "torchrun", message: "spawn torchrun ENOENT" },
  registered: { type: "registered", assignment },
  refused: { type: "refused", error: refusal },
  exited: { type: "exited", code: 0 },
  stop: { type: "stop" },
  reconfigure: { type: "reconfigure", assignment: reformed },
  "migrate-out": { type: "migrate-out" },
  saved: { type: "saved", bytes: 4096 },
  "all-saved": { type: "all-saved", migrateOut, bytes: 8192 },
  "checkpoint-sent": { type: "checkpoint-sent", migrateOut, at: T0, outcome: { bytes: 8192, transport: "tcp" } },
  barrier: { type: "barrier", step: 3 },
  finished: { type: "finished" },
};

/**
 * What every event does in every state: `acts` (the tests above say how), `quiet` (too late to
 * matter: nothing changes and nothing is said) or `illegal` (an error line, nothing changes).
 */
type Outcome = "acts" | "quiet" | "illegal";
const [A, Q, I] = ["acts", "quiet", "illegal"] as const;
const OUTCOMES: Record<LauncherEvent["type"], readonly Outcome[]> = {
  //                  registering starting running aborting finishing exited failed
  attached: [A, A, Q, Q, Q, Q, Q],
  spawned: [A, I, I, Q, I, I, I],
  "spawn-failed": [A, A, A, A, I, I, I],
  registered: [I, A, I, I, I, I, Q],
  refused: [A, A, I, I, I, I, Q],
  exited: [A, A, A, A, I, I, I],
  stop: [I, I, A, Q, Q, Q, Q],
  reconfigure: [I, I, A, Q, Q, Q, Q],
  "migrate-out": [I, I, A, Q, Q, Q, Q],
  saved: [Q, Q, Q, Q, Q, Q, Q],
  "all-saved": [I, I, A, Q, Q, Q, Q],
  "checkpoint-sent": [I, I, A, A, A, A, A],
  barrier: [I, I, A, Q, A, Q, Q],
  finished: [I, I, I, I, A, I, I],
};

const WHY: Partial<Record<LauncherEvent["type"], string>> = {
  spawned: "torchrun starts once",
  "spawn-failed": "torchrun ends once",
  exited: "torchrun ends once",
  finished: "only torchrun's clean exit finishes the job",
};

describe("every event in every state", () => {
  const cases = Object.entries(OUTCOMES).flatMap(([type, row]) => PHASES.map((phase, column) => [type as LauncherEvent["type"], phase, row[column]!] as const));

  it.each(cases)("%s while %s: %s", (type, phase, outcome) => {
    const state = STATES[phase];
    const t = transition(state, EVENTS[type], T0);
    if (outcome === "acts") {
      expect(t.state !== state || t.actions.length > 0 || t.log.length > 0).toBe(true);
      expect(t.log.filter((line) => line.text.startsWith("ignored "))).toEqual([]);
      return;
    }
    expect(t.state).toBe(state);
    expect(t.actions).toEqual([]);
    if (outcome === "quiet") {
      expect(t.log).toEqual([]);
      return;
    }
    const why = WHY[type] ?? expect.any(String);
    expect(t.log.at(-1)).toEqual({ level: "error", text: expect.stringMatching(new RegExp(`^ignored ${type} while ${phase}: `)) });
    expect(t.log.at(-1)?.text.slice(`ignored ${type} while ${phase}: `.length)).toEqual(why);
  });

  it("names why the registration's answers and a process's answers are illegal where they are", () => {
    expect(transition(registering, EVENTS.registered, T0).log).toEqual([
      { level: "error", text: "ignored registered while registering: the controller answered before torchrun started" },
    ]);
    expect(transition(running, EVENTS.refused, T0).log).toEqual([{ level: "error", text: "ignored refused while running: the registration is answered once" }]);
    expect(transition(starting, EVENTS.stop, T0).log).toEqual([
      { level: "error", text: "ignored stop while starting: no local process is answered before the registration" },
    ]);
    // A failure of torchrun's process after its end says both.
    expect(transition(exited, EVENTS["spawn-failed"], T0).log).toEqual([
      { level: "error", text: "could not start torchrun: spawn torchrun ENOENT" },
      { level: "error", text: "ignored spawn-failed while exited: torchrun ends once" },
    ]);
  });
});
