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
  { type: "start", stopStep: 7 },
  { type: "paused" },
  { type: "staging-ready", endpoint: "tcp://h2:1", token: "tk" },
  { type: "transferred", bytes: 100 },
  { type: "verified" },
  { type: "commit" },
  { type: "replacement-registered" },
  { type: "resumed" },
];

/** The record after the first `n` events of the happy path. */
const after = (n: number): Migration => (n === 0 ? base : run(happy.slice(0, n)).at(-1)!.migration);

describe("migration state machine", () => {
  it("walks planned → pausing → staging → transferring → verifying → staged → committing → resuming → done", () => {
    const steps = run(happy);
    expect(steps.map((t) => t.migration.state)).toEqual(["pausing", "staging", "transferring", "verifying", "staged", "committing", "resuming", "done"]);
    expect(steps.map((t) => t.actions.map((a) => a.type))).toEqual([
      ["hold-job", "prepare-staging"],
      [],
      ["migrate-out"],
      [],
      [],
      ["stop-source", "spawn-replacement"],
      ["reconfigure-job"],
      [],
    ]);
    // The stop is named for the plan step: every move of the job in that step shares it.
    expect(steps[0]?.actions[0]).toEqual({ type: "hold-job", job: "a", stop: "p0/step0", step: 7 });
    expect(steps[0]?.actions[1]).toEqual({ type: "prepare-staging", migration: "p0/0", host: 2, bytes: 100 });
    expect(steps[2]?.actions[0]).toEqual({ type: "migrate-out", migration: "p0/0", job: "a", from: 4, to: 2, endpoint: "tcp://h2:1", token: "tk", step: 7 });
    expect(steps[5]?.actions[1]).toEqual({ type: "spawn-replacement", migration: "p0/0", job: "a", group: 0, host: 2, token: "tk" });
    expect(steps.every((t) => t.log?.startsWith("migration p0/0 (a[0] 4→2): "))).toBe(true);
    expect(steps[0]?.log).toBe("migration p0/0 (a[0] 4→2): planned → pausing on start at barrier 7");
  });

  it("skips staging when the destination's grant arrives while the job is still pausing", () => {
    const steps = run([{ type: "start", stopStep: 7 }, { type: "staging-ready", endpoint: "tcp://h2:1", token: "tk" }, { type: "paused" }]);
    expect(steps.map((t) => t.migration.state)).toEqual(["pausing", "pausing", "transferring"]);
    expect(steps[1]?.migration).toMatchObject({ endpoint: "tcp://h2:1", token: "tk" });
    expect(steps[2]?.actions).toEqual([{ type: "migrate-out", migration: "p0/0", job: "a", from: 4, to: 2, endpoint: "tcp://h2:1", token: "tk", step: 7 }]);
    expect(steps[2]?.migration.history.map((h) => h.state)).toEqual(["planned", "pausing", "transferring"]);
    // A rollback while pausing now has a grant to release.
    expect(transition(steps[1]!.migration, { type: "fail", reason: "x" }, T0).actions.map((a) => a.type)).toEqual(["release-staging", "resume-job"]);
  });

  it("raises the stop step while pausing when the job's hosts agree on a later one, and never lowers it", () => {
    const pausing = after(1);
    const raised = transition(pausing, { type: "raise", stopStep: 9 }, T0);
    expect(raised.migration).toMatchObject({ state: "pausing", stopStep: 9, history: pausing.history });
    expect(raised.actions).toEqual([]);
    expect(raised.log).toBe("migration p0/0: the job stops at barrier 9, where its hosts agreed");
    // An earlier or the same step changes nothing.
    for (const stopStep of [8, 9]) expect(transition(raised.migration, { type: "raise", stopStep }, T0)).toEqual({ migration: raised.migration, actions: [], log: null });
    // The source checkpoints at the raised step.
    const out = run([{ type: "paused" }, { type: "staging-ready", endpoint: "tcp://h2:1", token: "tk" }], raised.migration).at(-1)!;
    expect(out.actions).toEqual([{ type: "migrate-out", migration: "p0/0", job: "a", from: 4, to: 2, endpoint: "tcp://h2:1", token: "tk", step: 9 }]);
    // Once the job is held the stop step is settled.
    const staging = after(2);
    expect(transition(staging, { type: "raise", stopStep: 12 }, T0)).toMatchObject({ migration: staging, actions: [], log: expect.stringMatching(/ignored raise in staging/) });
  });

  it("sets a deadline on entering each waiting state", () => {
    const steps = run(happy);
    const deadlines = steps.map((t) => [t.migration.state, t.migration.deadline === null ? null : t.migration.deadline - t.migration.since]);
    expect(deadlines).toEqual([
      ["pausing", DEFAULT_TIMEOUTS.pausing],
      ["staging", DEFAULT_TIMEOUTS.staging],
      ["transferring", DEFAULT_TIMEOUTS.transferring],
      ["verifying", DEFAULT_TIMEOUTS.verifying],
      ["staged", DEFAULT_TIMEOUTS.staged],
      ["committing", DEFAULT_TIMEOUTS.committing],
      ["resuming", DEFAULT_TIMEOUTS.resuming],
      ["done", null],
    ]);
  });

  // A failure in each state before committing: the rollback frees staging once a token
  // exists and releases the job's workers once they were held.
  const reversible: [number, MigrationState, string[]][] = [
    [0, "planned", []],
    [1, "pausing", ["resume-job"]],
    [2, "staging", ["resume-job"]],
    [3, "transferring", ["release-staging", "resume-job"]],
    [4, "verifying", ["release-staging", "resume-job"]],
    [5, "staged", ["release-staging", "resume-job"]],
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

  it.each(reversible.filter(([, s]) => s !== "planned"))("times out in %s events (%s) by the passed-in clock", (n, state) => {
    const m = after(n);
    const deadline = m.deadline!;
    const early = transition(m, { type: "tick" }, deadline - 1);
    expect(early.migration).toBe(m);
    expect(early.log).toBeNull();
    const late = transition(m, { type: "tick" }, deadline);
    expect(late.migration.state).toBe("rolled-back");
    expect(late.migration.reason).toBe(`timed out in ${state} after ${deadline - m.since} ms`);
  });

  it("rolls back on a checksum mismatch and on a short transfer", () => {
    expect(transition(after(4), { type: "checksum-mismatch", detail: "0x1 ≠ 0x2" }, T0).migration).toMatchObject({
      state: "rolled-back",
      reason: "checksum mismatch: 0x1 ≠ 0x2",
    });
    expect(transition(after(3), { type: "transferred", bytes: 99 }, T0).migration).toMatchObject({
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
    for (const n of [6, 7]) {
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
    const done = after(8);
    expect(transition(done, { type: "fail", reason: "x" }, T0).migration).toBe(done);
  });

  it("ignores events that do not fit the state, leaving the record untouched", () => {
    const m = after(1);
    for (const event of [{ type: "commit" }, { type: "verified" }, { type: "resumed" }, { type: "start", stopStep: 3 }] as MigrationEvent[]) {
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
