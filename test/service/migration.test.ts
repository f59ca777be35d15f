import { describe, expect, it } from "vitest";
import {
  DEFAULT_TIMEOUTS,
  MIGRATION_STATES,
  planned,
  transition,
  type Migration,
  type MigrationEvent,
  type MigrationState,
} from "../../controller/service/migration.ts";

const T0 = 1_000_000;
const base = planned({ id: "p0/0", job: "a", group: 0, from: 4, to: 2, planStep: 0, bytes: 100 }, T0);

/** Feeds events one by one at 10 ms intervals and returns every transition. */
function run(events: MigrationEvent[], start: Migration = base) {
  let m = start;
  let now = T0;
  return events.map((event) => {
    now += 10;
    const t = transition(m, event, now);
    m = t.migration;
    return t;
  });
}

const happy: MigrationEvent[] = [
  { type: "start" },
  { type: "staging-ready", endpoint: "tcp://h2:1", token: "tk" },
  { type: "replacement-ready" },
  { type: "pause", stopStep: 7 },
  { type: "paused" },
  { type: "transferred", bytes: 100 },
  { type: "verified" },
  { type: "commit" },
  { type: "replacement-registered" },
  { type: "resumed" },
];

/** The record after the first `n` events of the happy path. */
const after = (n: number): Migration => (n === 0 ? base : run(happy.slice(0, n)).at(-1)!.migration);

describe("migration state machine", () => {
  it("walks planned → staging → starting → ready → pausing → transferring → verifying → staged → committing → resuming → done", () => {
    const steps = run(happy);
    expect(steps.map((t) => t.migration.state)).toEqual([
      "staging",
      "starting",
      "ready",
      "pausing",
      "transferring",
      "verifying",
      "staged",
      "committing",
      "resuming",
      "done",
    ]);
    expect(steps.map((t) => t.actions.map((a) => a.type))).toEqual([
      ["prepare-staging"],
      [],
      [],
      ["hold-job"],
      ["migrate-out"],
      [],
      [],
      ["stop-source", "spawn-replacement"],
      ["reconfigure-job"],
      [],
    ]);
    expect(steps[0]?.actions[0]).toEqual({ type: "prepare-staging", migration: "p0/0", host: 2, bytes: 100 });
    expect(steps[1]?.migration).toMatchObject({ endpoint: "tcp://h2:1", token: "tk" });
    // The stop is named for the plan step: every move of the job in that step shares it.
    expect(steps[3]?.actions[0]).toEqual({ type: "hold-job", job: "a", stop: "p0/step0", step: 7 });
    expect(steps[4]?.actions[0]).toEqual({ type: "migrate-out", migration: "p0/0", job: "a", from: 4, to: 2, endpoint: "tcp://h2:1", token: "tk", step: 7 });
    expect(steps[7]?.actions[1]).toEqual({ type: "spawn-replacement", migration: "p0/0", job: "a", group: 0, host: 2, token: "tk" });
    expect(steps.every((t) => t.log?.startsWith("migration p0/0 (a[0] 4→2): "))).toBe(true);
    expect(steps[3]?.log).toBe("migration p0/0 (a[0] 4→2): ready → pausing on pause at barrier 7");
  });

  it("stops waiting for a replacement slow to start: past the starting timeout the move is ready without it", () => {
    const starting = after(2);
    expect(starting.deadline! - starting.since).toBe(DEFAULT_TIMEOUTS.starting);
    expect(transition(starting, { type: "tick" }, starting.deadline! - 1).migration).toBe(starting);
    const late = transition(starting, { type: "tick" }, starting.deadline!);
    expect(late.migration).toMatchObject({ state: "ready", deadline: null, reason: null });
    expect(late.actions).toEqual([]);
    expect(late.log).toContain(
      `starting → ready on tick (the replacement was not ready after ${DEFAULT_TIMEOUTS.starting} ms; the job pauses without waiting for it)`,
    );
    // Its registration, when it comes, changes nothing before the commit.
    expect(transition(late.migration, { type: "replacement-ready" }, T0).log).toMatch(/ignored replacement-ready in ready/);
  });

  it("raises the stop step while pausing when the job's hosts agree on a later one, and never lowers it", () => {
    const pausing = after(4);
    const raised = transition(pausing, { type: "raise", stopStep: 9 }, T0);
    expect(raised.migration).toMatchObject({ state: "pausing", stopStep: 9, history: pausing.history });
    expect(raised.actions).toEqual([]);
    expect(raised.log).toBe("migration p0/0: the job stops at barrier 9, where its hosts agreed");
    // An earlier or the same step changes nothing.
    for (const stopStep of [8, 9])
      expect(transition(raised.migration, { type: "raise", stopStep }, T0)).toEqual({ migration: raised.migration, actions: [], log: null });
    // The source checkpoints at the raised step.
    const out = run([{ type: "paused" }], raised.migration).at(-1)!;
    expect(out.actions).toEqual([{ type: "migrate-out", migration: "p0/0", job: "a", from: 4, to: 2, endpoint: "tcp://h2:1", token: "tk", step: 9 }]);
    // Once the job is held the stop step is settled.
    const transferring = after(5);
    expect(transition(transferring, { type: "raise", stopStep: 12 }, T0)).toMatchObject({
      migration: transferring,
      actions: [],
      log: expect.stringMatching(/ignored raise in transferring/),
    });
  });

  it("sets a deadline on entering each waiting state", () => {
    const steps = run(happy);
    const deadlines = steps.map((t) => [t.migration.state, t.migration.deadline === null ? null : t.migration.deadline - t.migration.since]);
    expect(deadlines).toEqual([
      ["staging", DEFAULT_TIMEOUTS.staging],
      ["starting", DEFAULT_TIMEOUTS.starting],
      ["ready", null],
      ["pausing", DEFAULT_TIMEOUTS.pausing],
      ["transferring", DEFAULT_TIMEOUTS.transferring],
      ["verifying", DEFAULT_TIMEOUTS.verifying],
      ["staged", DEFAULT_TIMEOUTS.staged],
      ["committing", DEFAULT_TIMEOUTS.committing],
      ["resuming", DEFAULT_TIMEOUTS.resuming],
      ["done", null],
    ]);
  });

  // A failure in each state before committing: the rollback frees staging once a token
  // exists and releases the job's workers once they were held. The job trains on, untouched,
  // until its move pauses it.
  const reversible: [number, MigrationState, string[]][] = [
    [0, "planned", []],
    [1, "staging", []],
    [2, "starting", ["release-staging"]],
    [3, "ready", ["release-staging"]],
    [4, "pausing", ["release-staging", "resume-job"]],
    [5, "transferring", ["release-staging", "resume-job"]],
    [6, "verifying", ["release-staging", "resume-job"]],
    [7, "staged", ["release-staging", "resume-job"]],
  ];
  it.each(reversible)("rolls back from %s events in (%s)", (n, state, actions) => {
    const m = after(n);
    expect(m.state).toBe(state);
    const t = transition(m, { type: "fail", reason: "source host died" }, T0 + 500);
    expect(t.migration.state).toBe("rolled-back");
    expect(t.migration.reason).toBe("source host died");
    expect(t.actions.map((a) => a.type)).toEqual(actions);
    expect(t.log).toContain(`${state} → rolled-back on fail: source host died`);
  });

  it.each(reversible.filter(([, s]) => s !== "planned" && s !== "ready" && s !== "starting"))(
    "times out in %s events (%s) by the passed-in clock",
    (n, state) => {
      const m = after(n);
      const deadline = m.deadline!;
      const early = transition(m, { type: "tick" }, deadline - 1);
      expect(early.migration).toBe(m);
      expect(early.log).toBeNull();
      const late = transition(m, { type: "tick" }, deadline);
      expect(late.migration.state).toBe("rolled-back");
      expect(late.migration.reason).toBe(`timed out in ${state} after ${deadline - m.since} ms`);
    },
  );

  it("rolls back on a checksum mismatch and on a short transfer", () => {
    expect(transition(after(6), { type: "checksum-mismatch", detail: "0x1 ≠ 0x2" }, T0).migration).toMatchObject({
      state: "rolled-back",
      reason: "checksum mismatch: 0x1 ≠ 0x2",
    });
    expect(transition(after(5), { type: "transferred", bytes: 99 }, T0).migration).toMatchObject({
      state: "rolled-back",
      reason: "received 99 bytes, expected 100",
    });
  });

  it("releases a staging granted after the move rolled back, which the rollback could not release", () => {
    const rolledBack = transition(after(1), { type: "fail", reason: "a worker went silent" }, T0).migration;
    expect(rolledBack).toMatchObject({ state: "rolled-back", token: null });
    const late = transition(rolledBack, { type: "staging-ready", endpoint: "tcp://h2:1", token: "tk" }, T0 + 10);
    expect(late.migration).toBe(rolledBack);
    expect(late.actions).toEqual([{ type: "release-staging", host: 2, token: "tk" }]);
    expect(late.log).toBe("migration p0/0: staging on host 2 was granted after the rollback; releasing it");
  });

  it("does not roll back a committed move: a late failure raises an alert and the move stands", () => {
    for (const n of [8, 9]) {
      const m = after(n);
      const t = transition(m, { type: "fail", reason: "destination daemon lost" }, T0);
      expect(t.migration.state).toBe(m.state);
      expect(t.migration.reason).toBe("destination daemon lost");
      expect(t.actions).toEqual([{ type: "alert", migration: "p0/0", message: "failure after commit: destination daemon lost" }]);
      // An overstay alerts once: the deadline is spent.
      const late = transition(m, { type: "tick" }, m.deadline!);
      expect(late.migration).toMatchObject({ state: m.state, deadline: null, reason: `timed out in ${m.state} after ${m.deadline! - m.since} ms` });
      expect(late.actions.map((a) => a.type)).toEqual(["alert"]);
      expect(transition(late.migration, { type: "tick" }, m.deadline! + 1).migration).toBe(late.migration);
    }
    const done = after(10);
    expect(transition(done, { type: "fail", reason: "x" }, T0).migration).toBe(done);
  });

  it("ignores events that do not fit the state, leaving the record untouched", () => {
    const m = after(4);
    for (const event of [
      { type: "commit" },
      { type: "verified" },
      { type: "resumed" },
      { type: "start" },
      { type: "pause", stopStep: 3 },
      { type: "replacement-ready" },
    ] as MigrationEvent[]) {
      const t = transition(m, event, T0);
      expect(t.migration).toBe(m);
      expect(t.actions).toEqual([]);
      expect(t.log).toMatch(/ignored/);
    }
  });

  it("covers every state in the published list", () => {
    const reached = new Set<MigrationState>(["planned", ...run(happy).map((t) => t.migration.state), "rolled-back"]);
    expect([...reached].sort()).toEqual([...MIGRATION_STATES].sort());
  });
});
