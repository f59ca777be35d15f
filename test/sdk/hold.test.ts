import { describe, expect, it } from "vitest";
import { advance, holdReport, initialHold, lastStep, NO_STOP, stopWord, type HoldEvent, type HoldStep, type HostHold } from "../../sdk/client/hold.ts";
import type { Order } from "../../sdk/contract/protocol/worker.ts";

/** A host of `ranks` processes, driven event by event on a fixed clock. */
function host(ranks: number) {
  let state: HostHold = initialHold(ranks, 0, 0);
  let now = 0;
  const run = (event: HoldEvent): HoldStep => {
    const next = advance(state, event, now, 1_000);
    state = next.state;
    return next;
  };
  return {
    get state() {
      return state;
    },
    at(ms: number) {
      now = ms;
      return this;
    },
    arrive: (rank: number, step: number) => run({ type: "arrive", rank, step }),
    order: (order: Order) => run({ type: "order", order }),
    saved: (rank: number) => run({ type: "saved", rank }),
    sent: () => run({ type: "sent" }),
    tick: () => run({ type: "tick" }),
    passed: (step: number) => run({ type: "passed", step }),
  };
}

const stopAt = (step: number, stop = "p0/step0"): Order => ({ kind: "stop-at", stop, step });
const migrateOut = (step: number): Order => ({ kind: "migrate-out", stop: "p0/step0", migration: "p0/0", to: 5, endpoint: "tcp://h5:7000", token: "t", step });
const kinds = (step: HoldStep) => step.answers.map((a) => [a.rank, a.answer.kind]);

describe("a host's stop point (sdk/client/hold.ts)", () => {
  it("answers every barrier at once while no stop is known", () => {
    const h = host(2);
    for (let step = 0; step < 5; step++) {
      expect(kinds(h.arrive(0, step))).toEqual([[0, "continue"]]);
      expect(kinds(h.arrive(1, step))).toEqual([[1, "continue"]]);
    }
    expect(h.state.phase).toBe("running");
    expect(lastStep(h.state)).toBe(4);
    expect(holdReport(h.state)).toBeNull();
  });

  it("holds every local process at the stop step, and reports once all are there", () => {
    const h = host(2);
    h.arrive(0, 0);
    h.arrive(1, 0);
    const told = h.order(stopAt(2));
    expect(told.report).toBe(true);
    expect(h.state.stop).toEqual({ id: "p0/step0", step: 2 });
    expect(kinds(h.arrive(0, 1))).toEqual([[0, "continue"]]);
    expect(kinds(h.arrive(0, 2))).toEqual([]);
    expect(kinds(h.arrive(1, 1))).toEqual([[1, "continue"]]);
    const last = h.arrive(1, 2);
    expect(kinds(last)).toEqual([]);
    expect(last.report).toBe(true);
    expect(holdReport(h.state)).toEqual({ stop: "p0/step0", step: 2, phase: "held" });
  });

  it("learning the stop late, holds at the first barrier none of its processes passed, and says so", () => {
    const h = host(2);
    for (let step = 0; step <= 3; step++) h.arrive(0, step);
    h.arrive(1, 2);
    // Asked for barrier 2, which local rank 0 passed: the host holds at 4, and reports that.
    h.order(stopAt(2));
    expect(holdReport(h.state)).toEqual({ stop: "p0/step0", step: 4, phase: "armed" });
    // Rank 1, behind, goes on to the agreed step.
    expect(kinds(h.arrive(1, 3))).toEqual([[1, "continue"]]);
    expect(kinds(h.arrive(1, 4))).toEqual([]);
    expect(kinds(h.arrive(0, 4))).toEqual([]);
    expect(h.state.phase).toBe("held");
  });

  it("moves on to a later stop step when another host had passed this one", () => {
    const h = host(1);
    h.order(stopAt(1));
    h.arrive(0, 0);
    h.arrive(0, 1);
    expect(h.state.phase).toBe("held");
    const raised = h.order(stopAt(2));
    expect(kinds(raised)).toEqual([[0, "continue"]]);
    expect(h.state).toMatchObject({ phase: "armed", stop: { step: 2 }, passed: 1 });
    // A stop only moves later: a repeat of the old order changes nothing.
    expect(h.order(stopAt(1)).answers).toEqual([]);
    expect(h.state.stop?.step).toBe(2);
  });

  it("takes a repeated order as no news, and never passes the stop", () => {
    const h = host(1);
    h.order(stopAt(1));
    h.order(stopAt(1));
    h.arrive(0, 0);
    h.arrive(0, 1);
    expect(h.order(stopAt(1))).toMatchObject({ answers: [], report: false });
    expect(h.arrive(0, 2).answers[0]?.answer).toMatchObject({ kind: "error", message: expect.stringContaining("already at barrier 1") });
  });

  it("lets go of the stop by itself after the hold timeout without word, and reports it until answered", () => {
    const h = host(2);
    h.order(stopAt(0));
    h.arrive(0, 0);
    h.arrive(1, 0);
    expect(h.at(999).tick().answers).toEqual([]);
    const released = h.at(1_000).tick();
    expect(kinds(released)).toEqual([
      [0, "continue"],
      [1, "continue"],
    ]);
    expect(released.log).toContain("letting go of stop p0/step0");
    expect(holdReport(h.state)).toEqual({ stop: "p0/step0", step: 0, phase: "released" });
    // A stop-at for the released stop (the controller has not read the report yet) is not taken again.
    h.order(stopAt(0));
    expect(kinds(h.arrive(0, 1))).toEqual([[0, "continue"]]);
    // The controller's `run` answers the report; the host reports nothing more.
    h.order({ kind: "run" });
    expect(holdReport(h.state)).toBeNull();
  });

  it("each word from the controller renews the hold", () => {
    const h = host(1);
    h.order(stopAt(0));
    h.arrive(0, 0);
    h.at(900).order(stopAt(0));
    expect(h.at(1_800).tick().answers).toEqual([]);
    expect(h.at(1_900).tick().answers).toHaveLength(1);
  });

  it("once sealed, waits for the controller however long it takes", () => {
    const h = host(1);
    h.order(stopAt(0));
    h.arrive(0, 0);
    expect(h.order({ kind: "seal", stop: "p0/step0" }).report).toBe(true);
    expect(h.at(60_000).tick().answers).toEqual([]);
    expect(holdReport(h.state)).toEqual({ stop: "p0/step0", step: 0, phase: "sealed" });
    const assignment = {
      job: "a",
      group: 0,
      host: 1,
      nodeRank: 0,
      nodes: 2,
      masterHost: 1,
      masterAddress: "h1",
      ringOrder: [1, 5],
      generation: 1,
      resumeStep: 0,
    };
    const reformed = h.order({ kind: "reconfigure", assignment });
    expect(kinds(reformed)).toEqual([[0, "reconfigure"]]);
    expect(h.state).toMatchObject({ phase: "running", generation: 1, stop: null, passed: 0 });
    expect(kinds(h.arrive(0, 1))).toEqual([[0, "continue"]]);
  });

  it("checkpoints the source: migrate-out, every process saves, the send, the seal and the stop", () => {
    const h = host(2);
    h.order(stopAt(3));
    h.arrive(0, 3);
    h.arrive(1, 3);
    expect(kinds(h.order(migrateOut(3)))).toEqual([
      [0, "migrate-out"],
      [1, "migrate-out"],
    ]);
    // A seal before the checkpoint went out waits for it.
    h.order({ kind: "seal", stop: "p0/step0" });
    expect(h.state.phase).toBe("saving");
    expect(h.saved(0).send).toBe(false);
    expect(h.saved(1).send).toBe(true);
    expect(h.sent().report).toBe(true);
    expect(holdReport(h.state)).toEqual({ stop: "p0/step0", step: 3, phase: "saved" });
    h.order({ kind: "seal", stop: "p0/step0" });
    expect(kinds(h.order({ kind: "stop", reason: "replaced" }))).toEqual([
      [0, "stop"],
      [1, "stop"],
    ]);
    expect(kinds(h.arrive(0, 4))).toEqual([[0, "stop"]]);
  });

  it("a rollback while the source saves lets each process train on once it saved", () => {
    const h = host(2);
    h.order(stopAt(0));
    h.arrive(0, 0);
    h.arrive(1, 0);
    h.order(migrateOut(0));
    h.saved(0);
    expect(kinds(h.order({ kind: "run" }))).toEqual([[0, "continue"]]);
    expect(kinds(h.saved(1))).toEqual([[1, "continue"]]);
    expect(kinds(h.arrive(0, 1))).toEqual([[0, "continue"]]);
  });

  it("ignores orders that do not fit its phase, and says so in its next report", () => {
    const h = host(1);
    expect(h.order(migrateOut(0))).toMatchObject({ answers: [], report: true, log: expect.stringContaining("ignored migrate-out") });
    const assignment = {
      job: "a",
      group: 0,
      host: 1,
      nodeRank: 0,
      nodes: 2,
      masterHost: 1,
      masterAddress: "h1",
      ringOrder: [1, 5],
      generation: 3,
      resumeStep: 0,
    };
    expect(h.order({ kind: "reconfigure", assignment }).answers).toEqual([]);
    expect(h.state.generation).toBe(0);
  });

  it("counts barriers passed in the control block, and publishes its stop there as the word processes read", () => {
    const h = host(2);
    expect(stopWord(h.state)).toBe(NO_STOP);
    // Processes passed barriers 0 to 6 without a message; the launcher read their words.
    h.passed(6);
    h.passed(3);
    expect(lastStep(h.state)).toBe(6);
    h.order(stopAt(4));
    expect(h.state.stop).toEqual({ id: "p0/step0", step: 7 });
    expect(stopWord(h.state)).toBe(7);
    h.arrive(0, 7);
    h.arrive(1, 7);
    h.order({ kind: "seal", stop: "p0/step0" });
    h.order({ kind: "stop", reason: "replaced" });
    // Stopped: every barrier asks, and is told to stop.
    expect(stopWord(h.state)).toBe(0);
  });
});
