import { z } from "zod";

/**
 * The sizes MonkeyTree supports, in one place: every message field and every snapshot number
 * is checked against these, so no input can make the controller, a daemon or the CLI allocate,
 * loop or print without bound. The topology limits are what the planner handles: 131,072
 * GPUs, the size of today's largest training clusters. Its memory grows with groups × racks;
 * HiGHS, whose memory grows fastest, gets no program past `MAX_PROGRAM_CELLS`
 * (controller/planner/plan/planner.ts), and the worst snapshot within these limits (8,192 two-host
 * jobs over 1,024 racks of 16, every rack over its bound) peaks at 485 MB.
 */

/** Hosts in a topology (`racks × hostsPerRack`); also bounds `parallelism.dp` and `pp`. */
export const MAX_HOSTS = 16_384;
/** Racks in a topology. */
export const MAX_RACKS = 1_024;
/** Hosts in one rack. */
export const MAX_HOSTS_PER_RACK = 64;
/** GPUs in one host; also bounds `parallelism.tp` and a job's `rings`, since TP ranks share a host. */
export const MAX_GPUS_PER_HOST = 64;
/** Uplinks leaving one rack (and spines); routing keeps per-uplink tables of this size. */
export const MAX_UPLINKS_PER_RACK = 64;
/** The highest fragmentation degree any supported cluster can have: every host's every ring leaving. */
export const MAX_FRAGMENTATION = MAX_HOSTS * MAX_GPUS_PER_HOST;
/** A snapshot file: the largest supported cluster's, pretty-printed, is well under it. */
export const MAX_SNAPSHOT_BYTES = 16 * 1024 * 1024;
/**
 * A topology file (YAML, JSON or topology.conf): the largest supported topology, 1,024 racks
 * of 16 hosts in pods, every rack, pod and host name 128 characters long and on a line of its
 * own, is 2.6 MB as pretty-printed JSON and 2.5 MB as YAML; a YAML document this size parses
 * in seconds, one four times larger in half a minute.
 */
export const MAX_TOPOLOGY_BYTES = 4 * 1024 * 1024;

/** Job ids, migration ids, tokens: short names with no control characters, so a log line stays one line. */
export const MAX_ID_LENGTH = 128;
/** Free text in a message: a refusal's reason, a transfer's detail, an error message. */
export const MAX_TEXT_LENGTH = 1_024;
/** An endpoint or address: `tcp://HOST:PORT?rdma` with a DNS name at most 253 characters long. */
export const MAX_ADDRESS_LENGTH = 300;
/** Entries in a list a message carries (a ring order, a status report's jobs). */
export const MAX_LIST_LENGTH = MAX_HOSTS;

/** One frame the controller accepts; a request is small, so anything larger is cut off unread. */
export const MAX_REQUEST_BYTES = 1024 * 1024;
/**
 * One frame a client or daemon accepts: the largest status report of the largest topology fits
 * (every one of 16,384 hosts unavailable with a reason of the longest text is 17 MB).
 */
export const MAX_REPLY_BYTES = 64 * 1024 * 1024;

/** Characters an id may hold: printable, no spaces, quotes or backslashes, so it reads the same logged or quoted. */
const ID = /^[A-Za-z0-9._:@+=/-]*$/;
/** Control characters (newlines, terminal escapes) that could forge a log line or drive a terminal. */
// eslint-disable-next-line no-control-regex -- the class is exactly the control characters to remove
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/g;

/** An id field, such as `job` or `token`. */
export const idSchema = (what: string) =>
  z
    .string({ error: `${what} is a string` })
    .min(1, { error: `${what} must not be empty` })
    .max(MAX_ID_LENGTH, { error: `${what} is longer than ${MAX_ID_LENGTH} characters` })
    .regex(ID, { error: `${what} may hold only letters, digits and . _ : @ + = / -` });

/**
 * A text field of at most `max` characters, read as one line: control characters become
 * spaces rather than failing the message, since a peer's error text (a native error, say) may
 * hold a newline and the message is still worth reading.
 */
export const textSchema = (what: string, max = MAX_TEXT_LENGTH) =>
  z
    .string({ error: `${what} is a string` })
    .max(max, { error: `${what} is longer than ${max} characters` })
    .transform((text) => text.replace(CONTROL, " "));

/** A whole number in [min, max], with messages naming the field and the limit. */
export const intSchema = (what: string, min: number, max: number = Number.MAX_SAFE_INTEGER) =>
  z
    .int({ error: `${what} must be a whole number` })
    .min(min, { error: min === 0 ? `${what} must not be negative` : `${what} must be at least ${min}` })
    .max(max, { error: `${what} must be at most ${max}, the largest MonkeyTree supports` });

/**
 * A message as one line of at most `MAX_TEXT_LENGTH` characters, so no reply or log line built
 * from input grows with it or spans lines.
 */
export function oneLine(text: string): string {
  const flat = text.replace(CONTROL, " ");
  return flat.length > MAX_TEXT_LENGTH ? `${flat.slice(0, MAX_TEXT_LENGTH - 1)}…` : flat;
}
