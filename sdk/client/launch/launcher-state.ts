import type { Level } from "../../contract/log.ts";
import type { Assignment, Directive } from "../../contract/protocol/worker.ts";

/**
 * `monkeytree launch`'s agent (`launcher.ts`) as a pure state machine: `transition(state, event,
 * now)` returns the next state, the actions the launcher carries out, and the lines it logs. No
 * I/O and no clock of its own: time comes in with every event.
 *
 *   registering ─spawned─▶ starting ─registered─▶ running ─exited─▶ exited
 *   running ─exited 0, never told to stop─▶ finishing ─finished─▶ exited
 *   registering | starting ─exited─▶ failed
 *   registering | starting ─refused, or registered without a master address─▶ aborting ─exited─▶ failed
 *
 * The registration is under way from the start and torchrun starts meanwhile, so Python and the
 * script load while the job's other workers register (a replacement registers once every local
 * process waits at attach: `all-attached`). `run` ends only once torchrun is gone: with the code
 * of `exited`, or the error of `failed`; a job that trained to its end is `finishing` while the
 * controller hears of it.
 *
 * An event a state cannot have is an error the launcher logs, its state unchanged. What comes
 * late (a local process's answer once torchrun is gone or going, a registration answered after
 * torchrun died) changes nothing and says nothing.
 */

/** A problem the user can fix (a master host without a daemon, a checkpoint too large). */
export class LaunchError extends Error {
  override readonly name = "LaunchError";
}

type MigrateOut = Extract<Directive, { kind: "migrate-out" }>;

/** The furthest barrier logged (-1 before the first), and when the processes were last told to re-form; null once they trained on. */
interface Progress {
  readonly logged: number;
  readonly reformedAt: number | null;
}

/** While this host is a move's source: when its processes were told to save, and the bytes they wrote. */
interface Saving {
  readonly asked: number;
  readonly written: number;
}

/** Until the registration is answered: how many local processes torchrun runs, and those waiting at attach. */
interface Gathering {
  readonly processes: number;
  readonly attached: ReadonlySet<number>;
}

export type LauncherState =
  /** torchrun is being started. */
  | ({ readonly phase: "registering" } & Gathering)
  /** torchrun runs; its processes' attach waits for the registration. */
  | ({ readonly phase: "starting" } & Gathering)
  /** `stopped`: a local process was told to stop, so torchrun's exit does not end the job. */
  | { readonly phase: "running"; readonly assignment: Assignment; readonly stopped: boolean; readonly saving: Saving | null; readonly progress: Progress }
  /** The registration failed with `error`: torchrun was told to end, and `run` fails once it has. */
  | { readonly phase: "aborting"; readonly error: Error }
  /** torchrun ended well: the controller hears that the job is finished. */
  | { readonly phase: "finishing"; readonly progress: Progress }
  | { readonly phase: "exited"; readonly code: number; readonly why: string }
  | { readonly phase: "failed"; readonly error: Error };

export type SendOutcome = { readonly bytes: number; readonly transport: string } | { readonly failure: string };

export type LauncherEvent =
  /** Local process `localRank` waits at attach. */
  | { readonly type: "attached"; readonly localRank: number }
  | { readonly type: "spawned"; readonly pid: number | undefined }
  /** torchrun's process reported an error (most often that it could not start): it counts as ended with 127. */
  | { readonly type: "spawn-failed"; readonly program: string; readonly message: string }
  | { readonly type: "registered"; readonly assignment: Assignment }
  /** The registration failed: the controller refused the worker or the handshake, or never answered. */
  | { readonly type: "refused"; readonly error: Error }
  | { readonly type: "exited"; readonly code: number }
  /** A local process was told to stop, to re-form its group under `assignment`, or to save its checkpoint. */
  | { readonly type: "stop" }
  | { readonly type: "reconfigure"; readonly assignment: Assignment }
  | { readonly type: "migrate-out" }
  /** A local process saved `bytes` of checkpoint. */
  | { readonly type: "saved"; readonly bytes: number }
  /** Every local process saved: the host's checkpoint, `bytes` long, goes to the destination. */
  | { readonly type: "all-saved"; readonly migrateOut: MigrateOut; readonly bytes: number }
  /** The checkpoint whose send began at `at` went out, or did not. */
  | { readonly type: "checkpoint-sent"; readonly migrateOut: MigrateOut; readonly at: number; readonly outcome: SendOutcome }
  /** A local process reached barrier `step`, beyond every one seen before. */
  | { readonly type: "barrier"; readonly step: number }
  /** The controller heard that the job finished, or could not be told. */
  | { readonly type: "finished" };

export type LauncherAction =
  /** Every local process waits at attach: a replacement registers now. */
  | { readonly type: "all-attached" }
  | { readonly type: "terminate"; readonly signal: "SIGTERM" }
  /** Tell the controller the job finished, then feed `finished`. */
  | { readonly type: "finish" }
  /** Send the staged checkpoint to `migrateOut`'s destination, then feed `checkpoint-sent` with `at`. */
  | { readonly type: "send"; readonly migrateOut: MigrateOut; readonly at: number }
  /** `run` resolves with `code`, or rejects with `error`. */
  | { readonly type: "end"; readonly code: number }
  | { readonly type: "fail"; readonly error: Error };

export interface LogLine {
  readonly level: Level;
  readonly text: string;
}

export interface Transition {
  readonly state: LauncherState;
  readonly actions: readonly LauncherAction[];
  /** Lines for the log, in order; none when there is nothing to say. */
  readonly log: readonly LogLine[];
}

/** A progress line at the first barrier, then every this many steps. */
const PROGRESS_EVERY = 50;

/** Before torchrun starts, which will run `processes` local processes. */
export function launching(processes: number): LauncherState {
  return { phase: "registering", processes, attached: new Set() };
}

/** Why a job whose master runs no daemon cannot form its process group, and what to do about it. */
export function masterUnknown(assignment: Assignment): LaunchError {
  const host = assignment.masterHost;
  return new LaunchError(
    `the job's master, host ${host}, runs no monkeytree daemon, so its address is unknown; start \`monkeytree daemon --host ${host}\` there`,
  );
}

type Illegal = (why: string) => Transition;

export function transition(state: LauncherState, event: LauncherEvent, now: number): Transition {
  const illegal: Illegal = (why) => ({ state, actions: [], log: [line("error", `ignored ${event.type} while ${state.phase}: ${why}`)] });
  switch (event.type) {
    case "attached":
      return attached(state, event.localRank);
    case "spawned":
      // Told to end before its start was seen: the registration failed at once.
      if (state.phase === "aborting") return quiet(state);
      if (state.phase !== "registering") return illegal("torchrun starts once");
      return {
        state: { ...state, phase: "starting" },
        actions: [],
        log: [moved("registering", "starting", `torchrun started (pid ${event.pid ?? "?"}) with ${state.processes} local processes; registering`)],
      };
    case "spawn-failed": {
      const next = ended(state, 127, illegal);
      return { ...next, log: [line("error", `could not start ${event.program}: ${event.message}`), ...next.log] };
    }
    case "exited":
      return ended(state, event.code, illegal);
    case "registered":
    case "refused":
      return answered(state, event, illegal);
    case "finished":
      if (state.phase !== "finishing") return illegal("only torchrun's clean exit finishes the job");
      return exit(0, "training ended; the job is finished");
    case "saved":
      // A process may say it saved at any time; only while this host saves for a move does it count.
      if (state.phase !== "running" || state.saving === null) return quiet(state);
      return quiet({ ...state, saving: { ...state.saving, written: state.saving.written + event.bytes } });
    default:
      return told(state, event, now, illegal);
  }
}

function attached(state: LauncherState, localRank: number): Transition {
  // Once the registration is answered, no attach is waited for.
  if ((state.phase !== "registering" && state.phase !== "starting") || state.attached.has(localRank)) return quiet(state);
  const ranks = new Set(state.attached).add(localRank);
  return { state: { ...state, attached: ranks }, actions: ranks.size === state.processes ? [{ type: "all-attached" }] : [], log: [] };
}

/** torchrun ended with `code`. */
function ended(state: LauncherState, code: number, illegal: Illegal): Transition {
  switch (state.phase) {
    case "registering":
    case "starting":
      return fail(new LaunchError(`torchrun exited with ${code} before the job took this host's worker`));
    case "aborting":
      return fail(state.error);
    case "running":
      if (code === 0 && !state.stopped) return { state: { phase: "finishing", progress: state.progress }, actions: [{ type: "finish" }], log: [] };
      return exit(code, state.stopped ? "stopped" : `torchrun failed with ${code}`);
    case "finishing":
    case "exited":
    case "failed":
      return illegal("torchrun ends once");
  }
}

/** The registration's outcome. */
function answered(state: LauncherState, event: Extract<LauncherEvent, { type: "registered" | "refused" }>, illegal: Illegal): Transition {
  switch (state.phase) {
    case "registering":
      // The controller answers over the network, after torchrun's start was seen; a request that
      // cannot even be sent fails at once.
      return event.type === "refused" ? abort(event.error) : illegal("the controller answered before torchrun started");
    case "starting": {
      if (event.type === "refused") return abort(event.error);
      const a = event.assignment;
      if (a.masterAddress === null) return abort(masterUnknown(a));
      return {
        state: { phase: "running", assignment: a, stopped: false, saving: null, progress: { logged: -1, reformedAt: null } },
        actions: [],
        log: [moved("starting", "running", `node rank ${a.nodeRank} of ${a.nodes}, generation ${a.generation}`)],
      };
    }
    case "failed":
      // torchrun died first, which is what `run` fails with.
      return quiet(state);
    case "running":
    case "aborting":
    case "finishing":
    case "exited":
      return illegal("the registration is answered once");
  }
}

/** What a local process was told, or did, after its barrier was answered. */
function told(
  state: LauncherState,
  event: Extract<LauncherEvent, { type: "stop" | "reconfigure" | "migrate-out" | "all-saved" | "checkpoint-sent" | "barrier" }>,
  now: number,
  illegal: Illegal,
): Transition {
  if (state.phase === "registering" || state.phase === "starting") return illegal("no local process is answered before the registration");
  // A send may outlast torchrun: its outcome is told whenever it comes.
  if (event.type === "checkpoint-sent") return { state, actions: [], log: [sent(event, now)] };
  // Barriers passed just before torchrun's exit are seen at the host agent's next tick.
  if (event.type === "barrier" && state.phase === "finishing") return progressed(state, event.step, now);
  if (state.phase !== "running") return quiet(state);
  switch (event.type) {
    case "stop":
      return quiet({ ...state, stopped: true });
    case "reconfigure":
      return quiet({ ...state, assignment: event.assignment, progress: { ...state.progress, reformedAt: now } });
    case "migrate-out":
      return quiet(state.saving ? state : { ...state, saving: { asked: now, written: 0 } });
    case "all-saved": {
      const { migrateOut: m, bytes } = event;
      const { saving } = state;
      const after = saving ? `, ${seconds(now - saving.asked)} s after migrate-out` : "";
      return {
        state: { ...state, saving: null },
        actions: [{ type: "send", migrateOut: m, at: now }],
        log: [
          line(
            "info",
            `migration ${m.migration}: sending ${bytes} bytes to ${m.endpoint}; every local process saved, ${saving?.written ?? 0} bytes in all${after}`,
          ),
        ],
      };
    }
    case "barrier":
      return progressed(state, event.step, now);
  }
}

/**
 * A line per step seen (at debug level but the first and every so many), and when training
 * resumes after a re-formation.
 */
function progressed(state: Extract<LauncherState, { phase: "running" | "finishing" }>, step: number, now: number): Transition {
  const { logged, reformedAt } = state.progress;
  if (step <= logged) return quiet(state);
  const every = Math.floor(step / PROGRESS_EVERY) > Math.floor(logged / PROGRESS_EVERY);
  const log = [line(logged < 0 || every ? "info" : "debug", `barrier ${step} reached`)];
  if (reformedAt !== null)
    log.push(line("info", `training resumed: barrier ${step} reached ${seconds(now - reformedAt)} s after the group was told to re-form`));
  return { state: { ...state, progress: { logged: step, reformedAt: null } }, actions: [], log };
}

function sent(event: Extract<LauncherEvent, { type: "checkpoint-sent" }>, now: number): LogLine {
  const { migrateOut: m, outcome } = event;
  // The destination reports the failure (or goes silent); the controller rolls back.
  if ("failure" in outcome) return line("warn", `migration ${m.migration}: the checkpoint did not reach host ${m.to}: ${outcome.failure}`);
  return line("info", `migration ${m.migration}: sent ${outcome.bytes} bytes in ${seconds(now - event.at)} s over ${outcome.transport}`);
}

/** `finishing` is still `running` to whoever reads the log. */
const exit = (code: number, why: string): Transition => ({
  state: { phase: "exited", code, why },
  actions: [{ type: "end", code }],
  log: [moved("running", "exited", why)],
});

const fail = (error: Error): Transition => ({ state: { phase: "failed", error }, actions: [{ type: "fail", error }], log: [] });

const abort = (error: Error): Transition => ({ state: { phase: "aborting", error }, actions: [{ type: "terminate", signal: "SIGTERM" }], log: [] });

const quiet = (state: LauncherState): Transition => ({ state, actions: [], log: [] });

const line = (level: Level, text: string): LogLine => ({ level, text });

const moved = (from: LauncherState["phase"], to: LauncherState["phase"], why: string): LogLine => line("info", `${from} → ${to}: ${why}`);

const seconds = (ms: number): string => (ms / 1000).toFixed(3);
