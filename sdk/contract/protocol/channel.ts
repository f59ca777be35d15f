import { z } from "zod";
import { idSchema, intSchema, MAX_GPUS_PER_HOST } from "./limits.ts";

/**
 * Launcher ↔ training processes on one host: the local channel `monkeytree launch` opens for
 * the processes torchrun starts. A Unix stream socket at `$MONKEYTREE_CHANNEL`; every message
 * is one line of JSON. Each process (one per local rank) connects once, sends `attach`, then
 * `barrier` at the iterations where it must ask; the launcher answers every request with exactly
 * one message.
 *
 *   process                          launcher
 *   attach {localRank}        →
 *                             ←      attached {rank, worldSize, masterAddr, masterPort, resume, control}
 *   (each barrier below the control block's stop word passes without a message)
 *   barrier {step}            →      (answered at once, unless the host stops here for a move)
 *                             ←      directive continue | reconfigure | migrate-out | stop
 *   after migrate-out: saves its checkpoint into [offset, offset + length) of the named buffer
 *   saved {bytes}             →      (sends the host's checkpoints, asks the controller again)
 *                             ←      directive stop (moved) | continue (rolled back) | reconfigure
 *   phase {name, seconds}     →      (no answer: timings for the launcher's log)
 */

export const CHANNEL_VERSION = 1;
export const CHANNEL_ENV = "MONKEYTREE_CHANNEL";
/** The launcher also names the addon's CRC32C library for its processes, so the hook checksums checkpoints fast. */
export const CRC32C_LIBRARY_ENV = "MONKEYTREE_CRC32C_LIB";
/**
 * "1" in a replacement's processes, "0" in the others. A replacement's attach is answered only
 * once its move commits, with the job stopped; read before attach, this lets the script build
 * what needs no process group, and that its checkpoint will fill, while the job still trains.
 */
export const RESUMING_ENV = "MONKEYTREE_RESUMING";
/**
 * Set in a replacement's processes only: the node rank it will most likely have and the job's
 * node count, so that it can also build its share of a sharded model before attach. A forecast:
 * the group values attach returns are the ones to form the group with.
 */
export const EXPECTED_NODE_RANK_ENV = "MONKEYTREE_EXPECTED_NODE_RANK";
export const EXPECTED_NODES_ENV = "MONKEYTREE_EXPECTED_NODES";
/**
 * The staging ranges a process will use, named before attach so that it maps them while the job
 * trains rather than once stopped (0.04 s per 512 MiB, then 0.02 s to unmap): local rank r saves
 * into `[r × share, + share)` of the outbox, and a replacement's loads from `[offset + r × share,
 * + share)` of the inbox, the daemon's staging. The migrate-out directive and the attached
 * message's `resume` name the same ranges, and are the ones to use.
 */
export const OUTBOX_ENV = "MONKEYTREE_OUTBOX";
export const SHARE_ENV = "MONKEYTREE_SHARE";
export const INBOX_ENV = "MONKEYTREE_INBOX";
export const INBOX_OFFSET_ENV = "MONKEYTREE_INBOX_OFFSET";

/**
 * The longest request line the launcher reads (a request is well under 200 bytes); a longer one
 * is answered with an error and its connection closed, so no process makes the launcher buffer
 * without bound.
 */
export const MAX_CHANNEL_LINE_BYTES = 4096;
/** Linux's PID_MAX_LIMIT: no process id is larger. */
const MAX_PID = 4_194_304;

const whole = z.int().min(0);
const head = <T extends string>(type: T) => ({ v: z.literal(CHANNEL_VERSION), type: z.literal(type) });

// Requests come from the training script's processes, so every field is bounded as the
// controller's messages are: one process per GPU, and names that log as one short line.
const localRank = intSchema("localRank", 0, MAX_GPUS_PER_HOST - 1);
export const AttachSchema = z.strictObject({ ...head("attach"), localRank, pid: intSchema("pid", 1, MAX_PID) });
export const ChannelBarrierSchema = z.strictObject({ ...head("barrier"), localRank, step: intSchema("step", 0) });
export const SavedSchema = z.strictObject({ ...head("saved"), localRank, bytes: intSchema("bytes", 0) });
/** A timing the process measured (checkpoint write, load, process-group re-formation). */
export const PhaseSchema = z.strictObject({
  ...head("phase"),
  localRank,
  name: idSchema("phase name"),
  seconds: z.number({ error: "seconds must be a finite number" }).min(0, { error: "seconds must not be negative" }),
});

export const ChannelRequestSchema = z.discriminatedUnion("type", [AttachSchema, ChannelBarrierSchema, SavedSchema, PhaseSchema]);
export type ChannelRequest = z.infer<typeof ChannelRequestSchema>;

/** Where a process's checkpoint lives: a range of a /dev/shm staging buffer. */
export const StagedRangeSchema = z.strictObject({ buffer: z.string().min(1), offset: whole, length: whole });
export type StagedRange = z.infer<typeof StagedRangeSchema>;

/** How to form the job-wide process group: `init_method=tcp://masterAddr:masterPort`. */
const group = {
  rank: whole,
  worldSize: z.int().min(1),
  masterAddr: z.string().min(1),
  masterPort: z.int().min(1).max(65535),
  generation: whole,
};

/**
 * The launcher's control block: a /dev/shm buffer of 64-bit words. The word at `stopOffset` is
 * the barrier this host stops at (2^53 - 1 while there is none); the word at `slotOffset` is this
 * process's. With the addon's C library (`$MONKEYTREE_CRC32C_LIB`), a process at barrier `b` writes
 * `b` to its slot, then reads the stop word (`monkeytree_barrier_enter`, both sequentially
 * consistent), and passes the barrier without a message when `b` is below it; otherwise, or
 * without the library, it sends `barrier` (after `monkeytree_barrier_ask`, which sets its slot to
 * `b - 1`). The launcher writes the stop word before it reads the slots, so it always learns of
 * a barrier passed while it took a stop.
 */
export const ControlBlockSchema = z.strictObject({ buffer: z.string().min(1), stopOffset: whole, slotOffset: whole });
export type ControlBlock = z.infer<typeof ControlBlockSchema>;

export const AttachedSchema = z.strictObject({
  ...head("attached"),
  ...group,
  localRank: whole,
  /** A replacement's checkpoint, and the barrier step the job resumes after; null at a fresh start. */
  resume: z.strictObject({ ...StagedRangeSchema.shape, step: whole }).nullable(),
  /** Where this process passes barriers without a message; null: every barrier is a message. */
  control: ControlBlockSchema.nullable(),
});
export type Attached = z.infer<typeof AttachedSchema>;

export const ChannelDirectiveSchema = z.discriminatedUnion("kind", [
  z.strictObject({ kind: z.literal("continue") }),
  /** Destroy the process group and form it again with these values, then rebuild DDP. */
  z.strictObject({ kind: z.literal("reconfigure"), ...group }),
  /** Save this process's checkpoint into the range, then send `saved`. */
  z.strictObject({ kind: z.literal("migrate-out"), ...StagedRangeSchema.shape }),
  /** Exit cleanly: a replacement on another host carries on, or the job ended. */
  z.strictObject({ kind: z.literal("stop"), reason: z.string() }),
]);
export type ChannelDirective = z.infer<typeof ChannelDirectiveSchema>;

export const DirectiveMessageSchema = z.strictObject({ ...head("directive"), directive: ChannelDirectiveSchema });
export const ChannelErrorSchema = z.strictObject({ ...head("error"), message: z.string() });

export const ChannelReplySchema = z.discriminatedUnion("type", [AttachedSchema, DirectiveMessageSchema, ChannelErrorSchema]);
export type ChannelReply = z.infer<typeof ChannelReplySchema>;
