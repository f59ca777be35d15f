import type { Directive, Hold, Order } from "../contract/protocol/worker.ts";

/**
 * One host's side of the stop-point agreement (sdk/contract/protocol/README.md), as a pure state
 * machine: `advance(state, event, now, holdTimeoutMs)` returns the next state, the answers for
 * local processes waiting at a barrier, and whether the controller should hear of it now. No
 * I/O and no clock of its own. A barrier is answered here, on the host: the controller is never
 * on a training step's path.
 *
 *   running ─stop-at─▶ armed ─every process at the stop─▶ held ─migrate-out─▶ saving ─sent─▶ saved
 *   held | saved ─seal─▶ sealed ─reconfigure─▶ running        sealed ─stop─▶ stopped
 *   armed | held | saving | saved ─run, or no word for the hold timeout─▶ running
 *
 * A host passes barrier `b` only while `b` is below the stop it knows, and when told of a stop
 * at `k` it holds at `max(k, first barrier none of its processes passed)`, which it reports:
 * the controller stops the job at the largest step its hosts report, so no host has passed the
 * step the job stops at. Until it seals, a host that hears nothing from the controller for the
 * hold timeout lets go of the stop by itself (fail open) and reports that it did; once sealed,
 * only the controller ends the hold, since the move may have committed.
 */

export type HostPhase = "running" | "armed" | "held" | "saving" | "saved" | "sealed" | "stopped";

export interface HostHold {
  /** Local processes: every one of them reaches each barrier. */
  readonly ranks: number;
  readonly generation: number;
  /** The highest barrier a local process was let past; -1 before the first. */
  readonly passed: number;
  readonly phase: HostPhase;
  /** The stop this host holds at, or trains toward. */
  readonly stop: { readonly id: string; readonly step: number } | null;
  /** Local processes waiting for an answer, by local rank, and the barrier each waits at. */
  readonly waiting: ReadonlyMap<number, number>;
  /** When the controller was last heard from (ms, the caller's clock). */
  readonly heardAt: number;
  /** A stop this host let go of by itself, reported until the controller answers about it. */
  readonly released: { readonly id: string; readonly step: number } | null;
  /** The migration this host's checkpoint belongs to, while it is the source of one. */
  readonly migration: string | null;
  /** Local processes told to save that have not said they saved, even if the hold ended meanwhile. */
  readonly unsaved: ReadonlySet<number>;
  /** Why the host stopped, once it has. */
  readonly stopReason: string | null;
}

export type HoldEvent =
  /** Local process `rank` reached barrier `step`. */
  | { readonly type: "arrive"; readonly rank: number; readonly step: number }
  /** A local process passed barrier `step` without a message (the launcher's control block). */
  | { readonly type: "passed"; readonly step: number }
  /** After `migrate-out`, local process `rank` saved its checkpoint. */
  | { readonly type: "saved"; readonly rank: number }
  /** The host's checkpoint went out (or failed to: the destination reports which). */
  | { readonly type: "sent" }
  | { readonly type: "order"; readonly order: Order }
  | { readonly type: "tick" };

/** What a waiting process is told; `error` when it broke the channel protocol. */
export type Answer = Directive | { readonly kind: "error"; readonly message: string };

export interface HoldStep {
  readonly state: HostHold;
  readonly answers: readonly { readonly rank: number; readonly answer: Answer }[];
  /** The controller should hear of the new state now, not at the next timed report. */
  readonly report: boolean;
  /** Every local process saved: send the host's checkpoint, then fire `sent`. */
  readonly send: boolean;
  readonly log: string | null;
}

/** Without word from the controller for this long, a host that has not sealed lets go of its stop. */
export const DEFAULT_HOLD_TIMEOUT_MS = 20_000;

/** `passed`: the barrier a replacement resumes after; -1 at a fresh start. */
export function initialHold(ranks: number, generation: number, now: number, passed = -1): HostHold {
  return {
    ranks,
    generation,
    passed,
    phase: "running",
    stop: null,
    waiting: new Map(),
    heardAt: now,
    released: null,
    migration: null,
    unsaved: new Set(),
    stopReason: null,
  };
}

/** No stop: the control block's stop word, above any barrier. */
export const NO_STOP = Number.MAX_SAFE_INTEGER;

/**
 * The stop word processes read at each barrier: the stop while the host stops (its processes ask
 * from that barrier on), 0 once it stopped (every barrier asks, and is told to stop), else none.
 */
export function stopWord(h: HostHold): number {
  if (h.phase === "stopped") return 0;
  return h.stop?.step ?? NO_STOP;
}

/** The `hold` field of the host's next report. */
export function holdReport(h: HostHold): Hold | null {
  if (h.stop && h.phase !== "running" && h.phase !== "stopped") return { stop: h.stop.id, step: h.stop.step, phase: h.phase };
  return h.released ? { stop: h.released.id, step: h.released.step, phase: "released" } : null;
}

/** The last barrier a local process reached, or null before the first. */
export function lastStep(h: HostHold): number | null {
  const top = Math.max(h.passed, ...h.waiting.values());
  return top < 0 ? null : top;
}

const CONTINUE: Directive = { kind: "continue" };

export function advance(h: HostHold, event: HoldEvent, now: number, holdTimeoutMs = DEFAULT_HOLD_TIMEOUT_MS): HoldStep {
  switch (event.type) {
    case "arrive":
      return arrive(h, event.rank, event.step);
    case "passed":
      return event.step > h.passed ? quiet({ ...h, passed: event.step }) : quiet(h);
    case "saved":
      return saved(h, event.rank);
    case "sent":
      return h.phase === "saving" ? step({ ...h, phase: "saved" }, [], true, `checkpoint of ${h.migration ?? "?"} sent; waiting for the outcome`) : quiet(h);
    case "order":
      return obey({ ...h, heardAt: now }, event.order);
    case "tick":
      return expire(h, now, holdTimeoutMs);
  }
}

const step = (state: HostHold, answers: HoldStep["answers"], report: boolean, log: string | null = null, send = false): HoldStep => ({
  state,
  answers,
  report,
  send,
  log,
});
const quiet = (state: HostHold): HoldStep => step(state, [], false);
const refuse = (h: HostHold, rank: number, message: string): HoldStep => step(h, [{ rank, answer: { kind: "error", message } }], false);

function arrive(h: HostHold, rank: number, at: number): HoldStep {
  if (h.phase === "stopped") return step(h, [{ rank, answer: { kind: "stop", reason: h.stopReason ?? "stopped" } }], false);
  const waits = h.waiting.get(rank);
  if (waits !== undefined) return refuse(h, rank, `local rank ${rank} is already at barrier ${waits}; call barrier once per step and wait for its answer`);
  if (h.phase !== "running" && h.phase !== "armed")
    return refuse(h, rank, `local rank ${rank} reached barrier ${at} while the host is ${h.phase} at barrier ${h.stop?.step ?? "?"}`);
  const stop = h.stop;
  if (stop === null || at < stop.step) return step({ ...h, passed: Math.max(h.passed, at) }, [{ rank, answer: CONTINUE }], false);
  if (at > stop.step)
    return refuse(h, rank, `local rank ${rank} reached barrier ${at}, past the stop at ${stop.step}; every process must call barrier once per step`);
  const waiting = new Map(h.waiting).set(rank, at);
  if (waiting.size < h.ranks) return quiet({ ...h, waiting });
  return step({ ...h, waiting, phase: "held" }, [], true, `every local process holds at barrier ${at} (stop ${stop.id})`);
}

function saved(h: HostHold, rank: number): HoldStep {
  if (!h.unsaved.has(rank)) return refuse(h, rank, `local rank ${rank} saved a checkpoint nobody asked for (the host is ${h.phase})`);
  const unsaved = new Set(h.unsaved);
  unsaved.delete(rank);
  if (h.phase === "stopped") return step({ ...h, unsaved }, [{ rank, answer: { kind: "stop", reason: h.stopReason ?? "stopped" } }], false);
  // The hold ended while the process saved: it trains on.
  if (h.phase !== "saving" || h.stop === null) return step({ ...h, unsaved }, [{ rank, answer: CONTINUE }], false);
  const waiting = new Map(h.waiting).set(rank, h.stop.step);
  return step({ ...h, waiting, unsaved }, [], false, null, unsaved.size === 0);
}

/** Answers every waiting process with `answer`. */
const answerAll = (h: HostHold, answer: Answer) => [...h.waiting.keys()].map((rank) => ({ rank, answer }));

/** The host's processes are let past its stop: what they will have passed once they go on. */
function passedOnRelease(h: HostHold): number {
  if (h.stop && h.phase !== "armed") return Math.max(h.passed, h.stop.step);
  return Math.max(h.passed, ...h.waiting.values());
}

function obey(h: HostHold, order: Order): HoldStep {
  if (h.phase === "stopped") return quiet(h);
  switch (order.kind) {
    case "run":
      if (h.phase === "running") return quiet(h.released ? { ...h, released: null } : h);
      return step(
        { ...h, phase: "running", stop: null, waiting: new Map(), passed: passedOnRelease(h), migration: null, released: null },
        answerAll(h, CONTINUE),
        true,
        `the controller released stop ${h.stop?.id ?? "?"}: training on`,
      );
    case "stop-at":
      return arm(h, order.stop, order.step);
    case "migrate-out": {
      if ((h.phase === "saving" || h.phase === "saved") && h.migration === order.migration) return quiet(h);
      if (h.phase !== "held" || h.stop?.id !== order.stop || h.stop.step !== order.step) return ignored(h, order.kind);
      const answer: Answer = { kind: "migrate-out", migration: order.migration, to: order.to, endpoint: order.endpoint, token: order.token, step: order.step };
      return step(
        { ...h, phase: "saving", waiting: new Map(), unsaved: new Set(h.waiting.keys()), migration: order.migration },
        answerAll(h, answer),
        true,
        `migration ${order.migration}: checkpointing at barrier ${order.step} for host ${order.to}`,
      );
    }
    case "seal":
      if (h.phase === "sealed" && h.stop?.id === order.stop) return quiet(h);
      // A source still sending seals once its checkpoint went out; its report then asks again.
      if ((h.phase !== "held" && h.phase !== "saved") || h.stop?.id !== order.stop) return quiet(h);
      return step({ ...h, phase: "sealed" }, [], true, `sealed at barrier ${h.stop.step}: only the controller ends this hold now`);
    case "reconfigure": {
      const a = order.assignment;
      if (h.phase === "running" && a.generation === h.generation) return quiet(h);
      if (h.phase !== "sealed") return ignored(h, `${order.kind} to generation ${a.generation}`);
      return step(
        { ...h, phase: "running", stop: null, waiting: new Map(), passed: passedOnRelease(h), generation: a.generation, migration: null },
        answerAll(h, { kind: "reconfigure", assignment: a }),
        true,
        `re-forming at generation ${a.generation}`,
      );
    }
    case "stop":
      return step(
        { ...h, phase: "stopped", stopReason: order.reason, waiting: new Map() },
        answerAll(h, { kind: "stop", reason: order.reason }),
        false,
        `stopping: ${order.reason}`,
      );
  }
}

const ignored = (h: HostHold, what: string): HoldStep => step(h, [], true, `ignored ${what} while ${h.phase}${h.stop ? ` at stop ${h.stop.id}` : ""}`);

/** Takes stop `id` at `at`, or later if a local process already passed it; a stop only moves later. */
function arm(h: HostHold, id: string, at: number): HoldStep {
  if (h.released?.id === id) return step(h, [], true);
  if (h.phase !== "running" && h.phase !== "armed" && h.phase !== "held") return h.stop?.id === id ? quiet(h) : ignored(h, `stop ${id}`);
  const current = h.stop?.id === id ? h.stop.step : 0;
  const target = Math.max(at, h.passed + 1, current);
  if (h.stop?.id === id && h.stop.step === target) return quiet(h);
  // Processes held at an earlier stop go on to the new one.
  const answers: HoldStep["answers"][number][] = [];
  const waiting = new Map<number, number>();
  let passed = h.passed;
  for (const [rank, waitsAt] of h.waiting) {
    if (waitsAt === target) {
      waiting.set(rank, waitsAt);
    } else {
      answers.push({ rank, answer: CONTINUE });
      passed = Math.max(passed, waitsAt);
    }
  }
  const phase = waiting.size === h.ranks ? "held" : "armed";
  const late = target > at ? ` (barrier ${at} was asked; a local process had passed barrier ${h.passed})` : "";
  return step({ ...h, phase, stop: { id, step: target }, waiting, passed, released: null }, answers, true, `stop ${id}: holding at barrier ${target}${late}`);
}

function expire(h: HostHold, now: number, holdTimeoutMs: number): HoldStep {
  if (h.phase !== "armed" && h.phase !== "held" && h.phase !== "saving" && h.phase !== "saved") return quiet(h);
  const silentMs = now - h.heardAt;
  if (silentMs < holdTimeoutMs || h.stop === null) return quiet(h);
  return step(
    { ...h, phase: "running", stop: null, waiting: new Map(), passed: passedOnRelease(h), migration: null, released: h.stop },
    answerAll(h, CONTINUE),
    true,
    `no word from the controller for ${Math.round(silentMs)} ms (hold timeout ${holdTimeoutMs} ms): letting go of stop ${h.stop.id} and training on`,
  );
}
