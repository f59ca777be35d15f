import { describe, expect, it } from "vitest";
import { planned, type Migration, type MigrationState } from "../../controller/service/migration.ts";
import { decideStep } from "../../controller/service/steps.ts";

const move = (id: string, planStep: number, state: MigrationState, reason: string | null = null): Migration => ({
  ...planned({ id, job: `j${id}`, group: 0, from: 0, to: 1, planStep, bytes: 1 }, 0),
  state,
  reason,
});

describe("step orchestration", () => {
  it("starts every move of the first step together, and nothing of later steps", () => {
    expect(decideStep([move("0", 0, "planned"), move("1", 0, "planned"), move("2", 1, "planned")])).toEqual({ type: "start", ids: ["0", "1"] });
  });

  it("pauses the step's jobs together once every move's replacement is ready, not before", () => {
    expect(decideStep([move("0", 0, "ready"), move("1", 0, "starting"), move("2", 1, "planned")])).toEqual({ type: "wait" });
    expect(decideStep([move("0", 0, "ready"), move("1", 0, "ready"), move("2", 1, "planned")])).toEqual({ type: "pause", ids: ["0", "1"] });
  });

  it("waits until every source of the step has staged before any destination loads", () => {
    expect(decideStep([move("0", 0, "staged"), move("1", 0, "transferring"), move("2", 1, "planned")])).toEqual({ type: "wait" });
    expect(decideStep([move("0", 0, "staged"), move("1", 0, "staged"), move("2", 1, "planned")])).toEqual({ type: "commit", ids: ["0", "1"] });
  });

  it("starts the next step only when the current one is done", () => {
    expect(decideStep([move("0", 0, "resuming"), move("1", 0, "done"), move("2", 1, "planned")])).toEqual({ type: "wait" });
    expect(decideStep([move("0", 0, "done"), move("1", 0, "done"), move("2", 1, "planned")])).toEqual({ type: "start", ids: ["2"] });
    expect(decideStep([move("0", 0, "done"), move("2", 1, "done")])).toEqual({ type: "finished", outcome: "done" });
  });

  it("rolls back the rest of the plan when one move rolls back, keeping committed moves", () => {
    const decision = decideStep([move("0", 0, "done"), move("1", 1, "rolled-back", "timeout"), move("2", 1, "staged"), move("3", 2, "planned")]);
    expect(decision).toEqual({ type: "abort", ids: ["2", "3"], reason: "move 1 of the plan rolled back (timeout)" });
    expect(decideStep([move("0", 0, "done"), move("1", 1, "rolled-back"), move("2", 1, "rolled-back")])).toEqual({ type: "finished", outcome: "rolled-back" });
  });

  it("lets committed moves of a failed step finish before the plan ends", () => {
    expect(decideStep([move("0", 0, "resuming"), move("1", 1, "rolled-back")])).toEqual({ type: "wait" });
  });
});
