import { join } from "node:path";
import { z } from "zod";
import { readJsonFile } from "../../sdk/contract/errors.ts";
import { AuthFrameSchema, keyBytes, PrincipalSchema, sharedSecret, verifyFrame, Z85KeySchema } from "../../sdk/contract/protocol/auth.ts";
import { ProtocolError } from "../../sdk/contract/protocol/errors.ts";
import { UserNameSchema } from "../../sdk/contract/protocol/replacement.ts";

/** The controller's keyring inside the directory `monkeytree keys --dir` writes. */
export const KEYRING_FILE = "controller.json";

export const KeyringClientSchema = z.strictObject({
  /** The credential file's name, for log lines and for people. */
  name: z.string().min(1),
  publicKey: Z85KeySchema,
  principal: PrincipalSchema,
  /** A job key's: the local user its replacements run as on every host (`monkeytree keys --job J --user U`). */
  user: UserNameSchema.optional(),
});
export type KeyringClient = z.infer<typeof KeyringClientSchema>;

/** The controller's CURVE keypair and every client key it admits, with what each may do. */
export const KeyringSchema = z
  .strictObject({ publicKey: Z85KeySchema, secretKey: Z85KeySchema, clients: z.array(KeyringClientSchema) })
  .superRefine((keyring, ctx) => {
    const seen = new Set<string>();
    const hosts = new Set<number>();
    for (const [i, client] of keyring.clients.entries()) {
      if (seen.has(client.publicKey))
        ctx.addIssue({
          code: "custom",
          path: ["clients", i, "publicKey"],
          message: `key of ${client.name} is listed twice; each credential needs a key of its own`,
        });
      seen.add(client.publicKey);
      if (client.user !== undefined && client.principal.role !== "job")
        ctx.addIssue({
          code: "custom",
          path: ["clients", i, "user"],
          message: `${client.name} is a ${client.principal.role} key; only a job's key names a user`,
        });
      if (client.principal.role !== "daemon") continue;
      if (hosts.has(client.principal.host))
        ctx.addIssue({
          code: "custom",
          path: ["clients", i, "principal"],
          message: `host ${client.principal.host} has a second daemon key (${client.name}); a host's daemon has exactly one`,
        });
      hosts.add(client.principal.host);
    }
  });
export type Keyring = z.infer<typeof KeyringSchema>;

/**
 * Reads and checks `DIR/controller.json`; every failure names the file and how to make one,
 * and one its group or others may read is refused, saying to `chmod 600` it.
 */
export function loadKeyring(dir: string): Keyring {
  const path = join(dir, KEYRING_FILE);
  return readJsonFile(path, `keyring ${path}`, KeyringSchema, `create it with \`monkeytree keys --dir ${dir}\``, true);
}

/** The client keys a reload adds and removes, by credential name, sorted. */
export function keyringChange(before: Keyring, after: Keyring): { added: string[]; removed: string[] } {
  const keys = (keyring: Keyring) => new Set(keyring.clients.map((c) => c.publicKey));
  const [was, is] = [keys(before), keys(after)];
  const names = (clients: readonly KeyringClient[], other: ReadonlySet<string>) =>
    clients
      .filter((c) => !other.has(c.publicKey))
      .map((c) => c.name)
      .sort();
  return { added: names(after.clients, was), removed: names(before.clients, is) };
}

/**
 * Who sent a request, from its auth frame: the key must be in the keyring and the MAC must be
 * the request frame's under the secret that key shares with the controller's.
 */
export class Authenticator {
  private readonly clients: ReadonlyMap<string, KeyringClient>;
  private readonly admitted: ReadonlySet<string>;
  private readonly secrets = new Map<string, Buffer>();

  constructor(readonly keyring: Keyring) {
    this.clients = new Map(keyring.clients.map((c) => [c.publicKey, c]));
    this.admitted = new Set(keyring.clients.map((c) => keyBytes(c.publicKey).toString("hex")));
  }

  /** The local user job `job`'s replacements run as, where its key names one. */
  userOf(job: string): string | null {
    return this.keyring.clients.find((c) => c.principal.role === "job" && c.principal.job === job && c.user !== undefined)?.user ?? null;
  }

  /** Whether a CURVE handshake with this raw 32-byte client key may complete (the ZAP answer). */
  admits(key: Uint8Array): boolean {
    return this.admitted.has(Buffer.from(key).toString("hex"));
  }

  /** Whether this keyring is the controller keypair `other` is: a reload may change clients only. */
  sameServer(other: Keyring): boolean {
    return other.publicKey === this.keyring.publicKey && other.secretKey === this.keyring.secretKey;
  }

  /** The keyring client behind a request frame; `ProtocolError("forbidden")` when the proof fails. */
  senderOf(frame: Uint8Array, auth: Uint8Array | undefined): KeyringClient {
    if (!auth)
      throw new ProtocolError(
        "forbidden",
        "the request carries no auth frame; this controller has a keyring, so connect with a credential file (--credentials, or MONKEYTREE_CREDENTIALS)",
      );
    let parsed: unknown;
    try {
      parsed = JSON.parse(Buffer.from(auth).toString("utf8"));
    } catch {
      parsed = null;
    }
    const proof = AuthFrameSchema.safeParse(parsed);
    if (!proof.success) throw new ProtocolError("forbidden", "the auth frame is not { key, mac }; send requests through the monkeytree client");
    const client = this.clients.get(proof.data.key);
    if (!client) throw new ProtocolError("forbidden", "the auth frame names a key that is not in the controller's keyring");
    let secret = this.secrets.get(client.publicKey);
    if (!secret) {
      secret = sharedSecret(this.keyring, client.publicKey);
      this.secrets.set(client.publicKey, secret);
    }
    if (!verifyFrame(secret, frame, proof.data.mac))
      throw new ProtocolError("forbidden", `the request's MAC does not match ${client.name}'s key; the credential file holds another keypair than the keyring`);
    return client;
  }
}
