import type { Logger } from "../../sdk/contract/log.ts";
import type { PlanStatus } from "../planner/plan/schema.ts";
import type { DurableState, JournalRecord } from "./state.ts";

/**
 * What the controller tells those who watch it (its metrics, its event log): every journal
 * record as it is applied, and the decisions no record holds. Observers only look: they never
 * change the state, and a failing one must not stop a decision.
 */

export interface PlanOutcome {
  /** The id of the plan its moves were journaled under; null when it has none. */
  readonly plan: string | null;
  readonly status: PlanStatus;
  readonly moves: number;
  readonly steps: number;
  readonly seconds: number;
  /** Each rack's fragmentation degree when the planner was asked, and the bound it broke. */
  readonly fragmentation: readonly number[];
  readonly lambda: number;
}

export interface ControllerObserver {
  /** A record was journaled and applied; `before` is the state it changed. */
  applied(before: DurableState, record: JournalRecord): void;
  /** Some rack was over its bound and the planner answered. */
  planned(outcome: PlanOutcome): void;
  planFailed(reason: string): void;
  daemonLost(host: number, silentMs: number): void;
  /** A worker whose launcher heartbeated has been silent for `silentMs`. */
  workerLost(job: string, host: number, silentMs: number): void;
}

/** Tells every observer in turn; one that throws is logged, and the others and the decision go on. */
export function observeAll(observers: readonly ControllerObserver[], log: Logger): ControllerObserver {
  const tell = <K extends keyof ControllerObserver>(what: string, event: K, ...args: Parameters<ControllerObserver[K]>) => {
    for (const o of observers) {
      try {
        (o[event] as (...a: Parameters<ControllerObserver[K]>) => void)(...args);
      } catch (error) {
        log.error(() => `observing ${what} failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}`);
      }
    }
  };
  return {
    applied: (before, record) => tell(`record ${record.kind}`, "applied", before, record),
    planned: (outcome) => tell("a plan", "planned", outcome),
    planFailed: (reason) => tell("a failed plan", "planFailed", reason),
    daemonLost: (host, silentMs) => tell("a lost daemon", "daemonLost", host, silentMs),
    workerLost: (job, host, silentMs) => tell("a lost worker", "workerLost", job, host, silentMs),
  };
}
