import { isFinished, isReversible, type Migration } from "./migration.ts";

/**
 * What to do next with a plan's moves, as a pure decision over their current records. Steps
 * run in increasing `planStep`. Within a step every move pauses, stages and verifies before
 * any commits, and they commit together: a destination may be a host another move of the
 * same step vacates, so committing some and rolling back others could put two workers on one
 * host. One rolled-back move therefore rolls back everything not yet committed, and the plan
 * ends; the controller plans again from the placement it reached.
 */
export type StepDecision =
  | { readonly type: "start"; readonly ids: readonly string[] }
  | { readonly type: "pause"; readonly ids: readonly string[] }
  | { readonly type: "commit"; readonly ids: readonly string[] }
  | { readonly type: "abort"; readonly ids: readonly string[]; readonly reason: string }
  | { readonly type: "wait" }
  | { readonly type: "finished"; readonly outcome: "done" | "rolled-back" };

export function decideStep(moves: readonly Migration[]): StepDecision {
  const failed = moves.find((m) => m.state === "rolled-back");
  const open = moves.filter((m) => !isFinished(m.state));
  if (failed) {
    const reversible = open.filter((m) => isReversible(m.state));
    if (reversible.length) {
      return { type: "abort", ids: reversible.map((m) => m.id), reason: `move ${failed.id} of the plan rolled back (${failed.reason ?? "no reason"})` };
    }
  }
  if (open.length === 0) return { type: "finished", outcome: failed ? "rolled-back" : "done" };
  if (failed) return { type: "wait" };

  const current = open.reduce((min, m) => Math.min(min, m.planStep), Infinity);
  const step = moves.filter((m) => m.planStep === current);
  const waiting = step.filter((m) => m.state === "planned");
  if (waiting.length) return { type: "start", ids: waiting.map((m) => m.id) };
  if (step.every((m) => m.state === "ready")) return { type: "pause", ids: step.map((m) => m.id) };
  if (step.every((m) => m.state === "staged")) return { type: "commit", ids: step.map((m) => m.id) };
  return { type: "wait" };
}
