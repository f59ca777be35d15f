import { isFinished, isReversible, stopIdOf, transition, type Migration, type MigrationAction } from "./migration.ts";
import type { DurableState } from "./state.ts";

export interface Recovery {
  /** New states of the migrations that were in flight, to journal before anything else. */
  readonly migrations: readonly Migration[];
  readonly actions: readonly MigrationAction[];
  readonly log: readonly string[];
}

/**
 * What a restarted controller does with migrations its predecessor left in flight. Before
 * `committing` nothing outside depends on the move, and the connections that would finish it
 * are gone, so it rolls back: staging is released and the workers continue where they
 * stopped once they reach the new controller. A committed move stands: the replacement is
 * asked for again (spawning is idempotent on the daemon), and the job re-forms on its new
 * placement as its workers come back.
 */
export function recoverMigrations(state: DurableState, now: number): Recovery {
  const migrations: Migration[] = [];
  const actions: MigrationAction[] = [];
  const log: string[] = [];
  const inFlight = [...state.migrations.values()].filter((m) => !isFinished(m.state)).sort((a, b) => (a.id < b.id ? -1 : 1));
  for (const m of inFlight) {
    if (isReversible(m.state)) {
      const step = transition(m, { type: "fail", reason: "the controller restarted before the move committed" }, now);
      migrations.push(step.migration);
      actions.push(...step.actions);
      if (step.log) log.push(step.log);
    } else if (m.state === "committing") {
      // The job's hosts sealed their hold and wait for this outcome: the stop stands until the job re-forms.
      actions.push({ type: "hold-job", job: m.job, stop: stopIdOf(m), step: m.stopStep ?? 0, sealed: true });
      actions.push({ type: "spawn-replacement", migration: m.id, job: m.job, group: m.group, host: m.to, token: m.token ?? "" });
      log.push(`migration ${m.id}: committed before the restart; asking host ${m.to} for the replacement again`);
    } else {
      log.push(`migration ${m.id}: committed before the restart; the job re-forms as its workers return`);
    }
  }
  return { migrations, actions, log };
}
