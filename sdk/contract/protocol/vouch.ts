import { z } from "zod";
import { JobIdSchema } from "./envelope.ts";
import { textSchema } from "./limits.ts";

/**
 * Launcher → its host's daemon, over the host's local (Unix) socket: "a launcher of this job
 * runs here". Only a process on the host reaches the socket, so the daemon's word to the
 * controller (`daemon.vouch`) is what ties a job credential's new worker to a host it runs on.
 * One JSON line each way, then the daemon closes the connection.
 */
export const LocalVouchRequestSchema = z.strictObject({ job: JobIdSchema });
export type LocalVouchRequest = z.infer<typeof LocalVouchRequestSchema>;

export const LocalVouchReplySchema = z.union([z.strictObject({ vouched: z.literal(true) }), z.strictObject({ error: textSchema("error") })]);
export type LocalVouchReply = z.infer<typeof LocalVouchReplySchema>;

/** A request line is a job id and some JSON: anything longer is not one. */
export const MAX_LOCAL_VOUCH_BYTES = 1024;

/** Where host `host`'s daemon listens for its launchers unless told otherwise (`--vouch-socket`, `--daemon-socket`). */
export const defaultDaemonSocket = (host: number): string => `/run/monkeytree/daemon-${host}.sock`;
