import { z } from "zod";

/**
 * One worker's migration as a pure state machine: `transition(migration, event, now)` returns
 * the next record, the actions the executor must carry out (after journaling the record), and
 * a transition line to log. No I/O and no clock of its own: time comes in with every event.
 *
 *   planned ─start─▶ staging ─staging-ready─▶ starting ─replacement-ready─▶ ready ─pause─▶
 *   pausing ─paused─▶ transferring ─transferred─▶ verifying ─verified─▶ staged ─commit─▶
 *   committing ─replacement-registered─▶ resuming ─resumed─▶ done
 *
 * The job trains on until its replacement is ready: the destination stages (`staging`) and
 * starts the replacement (`starting`), whose processes import torch and the script and then
 * wait at attach, and register. Only once every move of the plan step is `ready` do the
 * step's jobs pause (`pause`), so the replacement's start costs no downtime. A replacement
 * that is not ready within the `starting` timeout is not waited for any longer: the job
 * pauses without it, and its registration is waited for after the commit.
 *
 * `staged` waits for the rest of the plan step: every source of a step stages its checkpoint
 * before any destination loads, so no move commits until all of its step are verified. Any
 * failure before `committing` (source or destination lost, checksum mismatch, a deadline
 * passed, a peer of the step failed) rolls back: staging is released and the job's workers
 * continue where they stopped. From `committing` on the move is final; late failures are
 * reported but cannot undo it: they raise an `alert` (an error in the log, the failure in the
 * move's `reason`, which the status shows) and the move stays where it is, without a deadline,
 * for an operator: the source was told to stop, so its state lives only in the destination's
 * staging.
 *
 * After a controller restart (`recovery.ts`), moves before `committing` fail and roll back; a
 * `committing` move asks its destination for the replacement again. Commands to a host's
 * daemon (staging, its release, the replacement) wait until that daemon has registered with
 * the new controller, for at most the heartbeat timeout from the restart, as long as a live
 * daemon takes to be heard from. A daemon that does not come back by then is lost: a rolled-back
 * move's release is dropped (its staging went with the daemon), and a committed move whose
 * destination never returns fails after commit, which is an alert.
 */

export const MIGRATION_STATES = [
  "planned",
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
  "rolled-back",
] as const;
export type MigrationState = (typeof MIGRATION_STATES)[number];

/** States from which a failure still rolls back. */
const REVERSIBLE: ReadonlySet<MigrationState> = new Set(["planned", "staging", "starting", "ready", "pausing", "transferring", "verifying", "staged"]);
export const isReversible = (state: MigrationState): boolean => REVERSIBLE.has(state);
export const isFinished = (state: MigrationState): boolean => state === "done" || state === "rolled-back";
/** Committed moves: their worker lives on the destination from now on. */
export const isCommitted = (state: MigrationState): boolean => state === "committing" || state === "resuming" || state === "done";

const count = z.int().min(0);

/** One move's record, as the journal holds it. */
export const MigrationSchema = z
  .strictObject({
    /** `plan id/index`, unique over the controller's life. */
    id: z.string(),
    job: z.string(),
    group: count,
    from: count,
    to: count,
    /** The plan step this move belongs to. */
    planStep: count,
    /** Bytes the destination stages: the source worker's checkpoint size. */
    bytes: count,
    state: z.enum(MIGRATION_STATES),
    /** When the current state was entered (ms, the controller's clock). */
    since: z.number(),
    /** Every state the move entered and when, oldest first: how long each phase took. */
    history: z.array(z.strictObject({ state: z.enum(MIGRATION_STATES), at: z.number() }).readonly()).readonly(),
    /** Past this the move fails with a timeout; null when the state has no deadline. */
    deadline: z.number().nullable(),
    /** The barrier step at which the job's workers stop together; set on `pause`. */
    stopStep: count.nullable(),
    endpoint: z.string().nullable(),
    token: z.string().nullable(),
    /** Why it rolled back, or what went wrong after it committed. */
    reason: z.string().nullable(),
  })
  .readonly();
export type Migration = z.infer<typeof MigrationSchema>;

export type MigrationEvent =
  | { readonly type: "start" }
  /** Its replacement registered before the commit: its processes wait at attach. */
  | { readonly type: "replacement-ready" }
  /** Every move of the plan step is ready: the job stops at barrier `stopStep`. */
  | { readonly type: "pause"; readonly stopStep: number }
  /** The job's hosts agreed on a later stop step (one had passed the first). */
  | { readonly type: "raise"; readonly stopStep: number }
  | { readonly type: "paused" }
  | { readonly type: "staging-ready"; readonly endpoint: string; readonly token: string }
  | { readonly type: "transferred"; readonly bytes: number }
  | { readonly type: "verified" }
  | { readonly type: "checksum-mismatch"; readonly detail: string }
  | { readonly type: "commit" }
  | { readonly type: "replacement-registered" }
  | { readonly type: "resumed" }
  | { readonly type: "fail"; readonly reason: string }
  | { readonly type: "tick" };

export type MigrationAction =
  /** Stop the job's workers at barrier `step` (stop `stop`, shared by the moves of one plan step). */
  | { readonly type: "hold-job"; readonly job: string; readonly stop: string; readonly step: number; readonly sealed?: true }
  /** Ask the destination to allocate staging for `bytes`; its answer is a `staging-ready` event. */
  | { readonly type: "prepare-staging"; readonly migration: string; readonly host: number; readonly bytes: number }
  /** Answer the source worker's held barrier with `migrate-out`. */
  | {
      readonly type: "migrate-out";
      readonly migration: string;
      readonly job: string;
      readonly from: number;
      readonly to: number;
      readonly endpoint: string;
      readonly token: string;
      readonly step: number;
    }
  | { readonly type: "release-staging"; readonly host: number; readonly token: string }
  /** The source worker is replaced: answer it `stop`. */
  | { readonly type: "stop-source"; readonly job: string; readonly host: number }
  /** The destination daemon starts the replacement launcher, which registers with `token`. */
  | {
      readonly type: "spawn-replacement";
      readonly migration: string;
      readonly job: string;
      readonly group: number;
      readonly host: number;
      readonly token: string;
    }
  /** Re-form the job on its new placement: every worker gets its new assignment. */
  | { readonly type: "reconfigure-job"; readonly job: string }
  /** Release the job's held workers where they stopped. */
  | { readonly type: "resume-job"; readonly job: string }
  /** A committed move cannot be undone; an operator must look at it. */
  | { readonly type: "alert"; readonly migration: string; readonly message: string };

export interface Transition {
  readonly migration: Migration;
  readonly actions: readonly MigrationAction[];
  /** One line for the log; null when the event changed nothing. */
  readonly log: string | null;
}

/**
 * Longest time a move may spend in each state (ms). Before `committing` a move that overstays
 * rolls back; after, it raises one alert, since only an operator can help a job whose
 * replacement never arrives.
 */
export interface MigrationTimeouts {
  readonly staging: number;
  /** How long the job trains on while its replacement starts; past it, the job pauses without waiting. */
  readonly starting: number;
  readonly pausing: number;
  readonly transferring: number;
  readonly verifying: number;
  readonly staged: number;
  readonly committing: number;
  readonly resuming: number;
}

/**
 * A replacement starts in seconds (Python, torch, the script), slower on a loaded host, and the
 * job trains meanwhile. Pausing waits at most a few iterations; transfers of tens of GB run seconds (paper §7:
 * a 12 GB shard in about 3 s), so a minute each leaves room for slow links without letting
 * a lost peer hold a job for long.
 */
export const DEFAULT_TIMEOUTS: MigrationTimeouts = {
  staging: 30_000,
  starting: 120_000,
  pausing: 120_000,
  transferring: 120_000,
  verifying: 30_000,
  staged: 120_000,
  committing: 300_000,
  resuming: 300_000,
};

export function planned(fields: Pick<Migration, "id" | "job" | "group" | "from" | "to" | "planStep" | "bytes">, now: number): Migration {
  return {
    ...fields,
    state: "planned",
    since: now,
    history: [{ state: "planned", at: now }],
    deadline: null,
    stopStep: null,
    endpoint: null,
    token: null,
    reason: null,
  };
}

export function transition(m: Migration, event: MigrationEvent, now: number, timeouts: MigrationTimeouts = DEFAULT_TIMEOUTS): Transition {
  const enter = (state: MigrationState, changes: Partial<Migration>, actions: MigrationAction[], note = ""): Transition => {
    const deadline = hasDeadline(state) ? now + timeouts[state] : null;
    const next: Migration = { ...m, ...changes, state, since: now, history: [...m.history, { state, at: now }], deadline };
    return { migration: next, actions, log: `migration ${m.id} (${m.job}[${m.group}] ${m.from}→${m.to}): ${m.state} → ${state} on ${event.type}${note}` };
  };
  const ignore = (why: string): Transition => ({ migration: m, actions: [], log: `migration ${m.id}: ignored ${event.type} in ${m.state} (${why})` });

  if (event.type === "fail") return fail(m, event.reason, enter, ignore);
  if (event.type === "tick") {
    if (m.deadline === null || now < m.deadline) return { migration: m, actions: [], log: null };
    // A replacement slow to start is not waited for: the move goes on, and after its commit
    // waits for the registration, as long as the job would have waited for it in any case.
    if (m.state === "starting")
      return enter("ready", {}, [], ` (the replacement was not ready after ${now - m.since} ms; the job pauses without waiting for it)`);
    return fail(m, `timed out in ${m.state} after ${now - m.since} ms`, enter, ignore);
  }

  const expect = (state: MigrationState) => m.state === state;
  switch (event.type) {
    case "start":
      if (!expect("planned")) return ignore("already started");
      // The destination stages and starts the replacement while the job trains on.
      return enter("staging", {}, [{ type: "prepare-staging", migration: m.id, host: m.to, bytes: m.bytes }]);
    case "staging-ready":
      if (expect("rolled-back")) {
        // The grant was asked for at the start and came after the rollback, which released
        // nothing it did not know of: released now, or the range stays reserved on the host.
        return {
          migration: m,
          actions: [{ type: "release-staging", host: m.to, token: event.token }],
          log: `migration ${m.id}: staging on host ${m.to} was granted after the rollback; releasing it`,
        };
      }
      if (!expect("staging")) return ignore("not waiting for staging");
      // A `starting` timeout of 0 waits for no replacement.
      return enter(timeouts.starting === 0 ? "ready" : "starting", { endpoint: event.endpoint, token: event.token }, []);
    case "replacement-ready":
      if (!expect("starting")) return ignore("not starting");
      return enter("ready", {}, []);
    case "pause":
      if (!expect("ready")) return ignore("not ready");
      return enter(
        "pausing",
        { stopStep: event.stopStep },
        [{ type: "hold-job", job: m.job, stop: stopIdOf(m), step: event.stopStep }],
        ` at barrier ${event.stopStep}`,
      );
    case "raise":
      if (!expect("pausing")) return ignore("not pausing");
      if (m.stopStep !== null && event.stopStep <= m.stopStep) return { migration: m, actions: [], log: null };
      return {
        migration: { ...m, stopStep: event.stopStep },
        actions: [],
        log: `migration ${m.id}: the job stops at barrier ${event.stopStep}, where its hosts agreed`,
      };
    case "paused":
      if (!expect("pausing")) return ignore("not pausing");
      return enter("transferring", {}, [migrateOut(m, m.endpoint ?? "", m.token ?? "")]);
    case "transferred":
      if (!expect("transferring")) return ignore("not transferring");
      if (event.bytes !== m.bytes) return fail(m, `received ${event.bytes} bytes, expected ${m.bytes}`, enter, ignore);
      return enter("verifying", {}, []);
    case "verified":
      if (!expect("verifying")) return ignore("not verifying");
      return enter("staged", {}, []);
    case "checksum-mismatch":
      if (!expect("verifying")) return ignore("not verifying");
      return fail(m, `checksum mismatch: ${event.detail}`, enter, ignore);
    case "commit":
      if (!expect("staged")) return ignore("not staged");
      return enter("committing", {}, [
        { type: "stop-source", job: m.job, host: m.from },
        { type: "spawn-replacement", migration: m.id, job: m.job, group: m.group, host: m.to, token: m.token ?? "" },
      ]);
    case "replacement-registered":
      if (!expect("committing")) return ignore("not committing");
      return enter("resuming", {}, [{ type: "reconfigure-job", job: m.job }]);
    case "resumed":
      if (!expect("resuming")) return ignore("not resuming");
      return enter("done", {}, []);
    default:
      return assertNever(event);
  }
}

/** The stop a move's job makes: one per plan step, which every move of the job in that step shares. */
export const stopIdOf = (m: Pick<Migration, "id" | "planStep">): string => `${m.id.slice(0, m.id.lastIndexOf("/"))}/step${m.planStep}`;

const migrateOut = (m: Migration, endpoint: string, token: string): MigrationAction => ({
  type: "migrate-out",
  migration: m.id,
  job: m.job,
  from: m.from,
  to: m.to,
  endpoint,
  token,
  step: m.stopStep ?? 0,
});

function fail(
  m: Migration,
  reason: string,
  enter: (state: MigrationState, changes: Partial<Migration>, actions: MigrationAction[], note?: string) => Transition,
  ignore: (why: string) => Transition,
): Transition {
  if (isFinished(m.state)) return ignore("already finished");
  if (!isReversible(m.state)) {
    return {
      migration: { ...m, reason, deadline: null },
      actions: [{ type: "alert", migration: m.id, message: `failure after commit: ${reason}` }],
      log: `migration ${m.id}: ${reason} after commit; the move stands`,
    };
  }
  const actions: MigrationAction[] = [];
  if (m.token !== null) actions.push({ type: "release-staging", host: m.to, token: m.token });
  // Only a job that was told to pause has workers to release.
  if (m.stopStep !== null) actions.push({ type: "resume-job", job: m.job });
  return enter("rolled-back", { reason }, actions, `: ${reason}`);
}

function hasDeadline(state: MigrationState): state is keyof MigrationTimeouts {
  switch (state) {
    case "staging":
    case "starting":
    case "pausing":
    case "transferring":
    case "verifying":
    case "staged":
    case "committing":
    case "resuming":
      return true;
    case "planned":
    case "ready":
    case "done":
    case "rolled-back":
      return false;
    default:
      return assertNever(state);
  }
}

export function assertNever(value: never): never {
  throw new Error(`unexpected value ${JSON.stringify(value)}`);
}
