import { z } from "zod";
import { TransferEndpointSchema } from "./endpoint.ts";
import { envelope, HostSchema, JobIdSchema } from "./envelope.ts";
import { idSchema, intSchema, textSchema } from "./limits.ts";

/** Daemon ↔ controller: one daemon per host registers it, heartbeats, and reports staging. */

const bytes = (what: string) => intSchema(`${what} (bytes)`, 0);

/**
 * A daemon process's id, random and fixed for its lifetime: the controller tells a daemon's
 * own re-registration (a resend, a reconnection) from a second daemon claiming its host.
 */
const IncarnationSchema = z.string().regex(/^[0-9a-f]{32}$/, { error: "incarnation is 32 hexadecimal digits, random per daemon process" });

export const HostRegisterSchema = z.strictObject({
  ...envelope("daemon.register"),
  host: HostSchema,
  incarnation: IncarnationSchema,
  /** Size of the pre-allocated migration staging buffer. */
  stagingBytes: bytes("stagingBytes"),
  /** Where the host's transfer engine listens. */
  endpoint: TransferEndpointSchema,
});
export type HostRegister = z.infer<typeof HostRegisterSchema>;

export const HeartbeatSchema = z.strictObject({ ...envelope("daemon.heartbeat"), host: HostSchema, incarnation: IncarnationSchema });
export type Heartbeat = z.infer<typeof HeartbeatSchema>;

/**
 * The destination's verdict on a checkpoint it received: `verified` (every byte arrived and
 * the checksums match), `checksum-mismatch`, or `failed` (the transfer broke off).
 */
export const TransferResultSchema = z.strictObject({
  ...envelope("daemon.transfer-result"),
  host: HostSchema,
  token: idSchema("token"),
  bytes: bytes("bytes"),
  outcome: z.enum(["verified", "checksum-mismatch", "failed"]),
  detail: textSchema("detail").optional(),
});
export type TransferResult = z.infer<typeof TransferResultSchema>;

/**
 * A replacement launcher this daemon started has exited. Before its workers registered, the
 * move it was to finish cannot: the controller rolls it back while it still can, or raises its
 * alert at once after the commit, rather than waiting out the state's deadline.
 */
export const ReplacementExitedSchema = z.strictObject({
  ...envelope("daemon.replacement-exited"),
  host: HostSchema,
  /** Named by its move as well: the exit may reach the controller before the grant's token did. */
  migration: idSchema("migration"),
  token: idSchema("token"),
  /** The launcher's exit code, or null when a signal ended it. */
  code: intSchema("code", 0, 255).nullable(),
  /** The signal that ended it (`SIGKILL`), or null. */
  signal: z
    .string()
    .regex(/^SIG[A-Z0-9]{1,12}$/, { error: "signal is a signal's name, such as SIGKILL" })
    .nullable(),
});
export type ReplacementExited = z.infer<typeof ReplacementExitedSchema>;

/**
 * A launcher of `job` asked this host's daemon, over the host's local socket, to vouch that it
 * runs here: with `--require-vouch` the controller takes a new worker of a job only on a host
 * whose daemon vouched for one of its launchers.
 */
export const VouchSchema = z.strictObject({ ...envelope("daemon.vouch"), host: HostSchema, incarnation: IncarnationSchema, job: JobIdSchema });
export type Vouch = z.infer<typeof VouchSchema>;

export const AckSchema = z.strictObject({ ...envelope("ack") });
export type Ack = z.infer<typeof AckSchema>;
