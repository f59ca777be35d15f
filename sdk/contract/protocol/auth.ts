import { createHmac, createPrivateKey, createPublicKey, diffieHellman, timingSafeEqual } from "node:crypto";
import { z } from "zod";
import { readJsonFile } from "../errors.ts";
import { JobIdSchema } from "./envelope.ts";

/**
 * Who sent a request. CURVE (with the controller's ZAP handler) admits only keys in its
 * keyring, but zeromq.js cannot tell which admitted key sent which message, so every request
 * carries a second frame, `{ key, mac }`: the sender's public key and an HMAC-SHA256 of the
 * request frame's exact bytes, keyed by the X25519 secret the sender's key shares with the
 * controller's. Only the holder of that secret key can compute it, and it names the key
 * whatever routing identity (or reconnection) the message came through.
 */

const Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#";
const Z85_VALUES = new Map([...Z85].map((c, i) => [c, i]));

/** Z85 text of a 32-byte CURVE (Curve25519) key, as zeromq's `curveKeyPair()` writes it. */
export const Z85KeySchema = z
  .string({ error: "a key is 40 characters of Z85 text" })
  .length(40, { error: "a key is 40 characters of Z85 text" })
  .refine((key) => z85Decode(key) !== null, { error: "a key is Z85 text, as zeromq's curveKeyPair() writes it" });

/** The bytes of Z85 text (ZeroMQ RFC 32); null when it is none. */
export function z85Decode(text: string): Buffer | null {
  if (text.length % 5 !== 0) return null;
  const out = Buffer.alloc((text.length / 5) * 4);
  for (let i = 0; i < text.length; i += 5) {
    let value = 0;
    for (const c of text.slice(i, i + 5)) {
      const digit = Z85_VALUES.get(c);
      if (digit === undefined) return null;
      value = value * 85 + digit;
    }
    if (value > 0xffffffff) return null;
    out.writeUInt32BE(value, (i / 5) * 4);
  }
  return out;
}

/** The 32 bytes of a key that passed `Z85KeySchema`. */
export function keyBytes(key: string): Buffer {
  const bytes = z85Decode(key);
  if (!bytes) throw new TypeError(`not a Z85 key: "${key}"`);
  return bytes;
}

/**
 * What a key may do, as the controller's keyring says: a host's daemon, one job's launchers
 * (its replacements included), or an operator (who may read `status`).
 */
export const PrincipalSchema = z.discriminatedUnion("role", [
  z.strictObject({ role: z.literal("daemon"), host: z.int().min(0) }),
  z.strictObject({ role: z.literal("job"), job: JobIdSchema }),
  z.strictObject({ role: z.literal("operator") }),
]);
export type Principal = z.infer<typeof PrincipalSchema>;

/** A client's credential file, as `monkeytree keys` writes it (mode 0600). */
export const CredentialSchema = z.strictObject({
  principal: PrincipalSchema,
  publicKey: Z85KeySchema,
  secretKey: Z85KeySchema,
  /** The controller's public key. */
  serverKey: Z85KeySchema,
});
export type Credential = z.infer<typeof CredentialSchema>;

/**
 * Reads a credential file; every failure names the file and the field. One that its group or
 * others may read is refused, saying to `chmod 600` it: its secret key is the holder's identity.
 */
export const readCredential = (path: string): Credential =>
  readJsonFile(path, `credential ${path}`, CredentialSchema, "`monkeytree keys` writes credential files", true);

/** The second frame of every request to a controller that has a keyring. */
export const AuthFrameSchema = z.strictObject({
  key: Z85KeySchema,
  mac: z.string().regex(/^[0-9a-f]{64}$/, { error: "mac is 64 hexadecimal digits (HMAC-SHA256)" }),
});
export type AuthFrame = z.infer<typeof AuthFrameSchema>;

const b64url = (key: string) => keyBytes(key).toString("base64url");

/**
 * The X25519 secret of one side's keypair and the other side's public key: the client and
 * the controller get the same 32 bytes, each from its own secret key.
 */
export function sharedSecret(own: { publicKey: string; secretKey: string }, peerPublicKey: string): Buffer {
  const privateKey = createPrivateKey({ key: { kty: "OKP", crv: "X25519", d: b64url(own.secretKey), x: b64url(own.publicKey) }, format: "jwk" });
  const publicKey = createPublicKey({ key: { kty: "OKP", crv: "X25519", x: b64url(peerPublicKey) }, format: "jwk" });
  return diffieHellman({ privateKey, publicKey });
}

const macOf = (secret: Buffer, frame: Uint8Array | string): Buffer => createHmac("sha256", secret).update(frame).digest();

/** The auth frame for one request frame, sent as the message's second frame. */
export function signFrame(credential: Pick<Credential, "publicKey">, secret: Buffer, frame: Uint8Array | string): string {
  return JSON.stringify({ key: credential.publicKey, mac: macOf(secret, frame).toString("hex") } satisfies AuthFrame);
}

/** Whether `mac` is this frame's MAC under `secret`, compared in constant time. */
export function verifyFrame(secret: Buffer, frame: Uint8Array | string, mac: string): boolean {
  const expected = macOf(secret, frame);
  const given = Buffer.from(mac, "hex");
  return given.length === expected.length && timingSafeEqual(given, expected);
}
