import { z } from "zod";
import { idSchema, MAX_HOSTS, MAX_ID_LENGTH } from "./limits.ts";

/**
 * Every message on the controller socket is one JSON frame: an envelope (protocol version,
 * message type, request id) with the type's fields beside it. A reply carries the id of its
 * request; requests a controller sends to a daemon use their own id space.
 */
/**
 * Version 2: launchers report progress on a timer and the controller pushes orders; training
 * never waits for the controller (version 1 met it at every barrier). Peers of different
 * versions refuse each other (`unsupported_version`).
 */
export const PROTOCOL_VERSION = 2;

export const RequestIdSchema = z.int({ error: "id is a whole-number request id" }).min(0).max(Number.MAX_SAFE_INTEGER);

/** The envelope alone: read first, so a wrong version or type gets its own clear error. */
export const EnvelopeSchema = z.object({
  v: z.int({ error: "v is the protocol version, a whole number" }),
  type: z
    .string({ error: "type names the message, a string" })
    .max(MAX_ID_LENGTH, { error: `type is longer than ${MAX_ID_LENGTH} characters; no message type is` }),
  id: RequestIdSchema,
});
export type Envelope = z.infer<typeof EnvelopeSchema>;

/** The envelope fields a message schema starts from, with its type fixed. */
export const envelope = <T extends string>(type: T) => ({
  v: z.literal(PROTOCOL_VERSION),
  type: z.literal(type),
  id: RequestIdSchema,
});

export const HostSchema = z
  .int({ error: "a host is a whole-number global index" })
  .min(0, { error: "host indices start at 0" })
  .max(MAX_HOSTS - 1, { error: `host indices end at ${MAX_HOSTS - 1}: MonkeyTree supports up to ${MAX_HOSTS} hosts` });
export const JobIdSchema = idSchema("a job id");
