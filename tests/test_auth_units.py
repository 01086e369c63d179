"""API tokens and JWTs: what is accepted, what is refused."""

from __future__ import annotations

import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from broker.auth.jwt_tokens import JwtConfig, JwtVerifier
from broker.auth.principal import AuthError, Scope
from broker.auth.tokens import TokenStore
from broker.store.client import commands, connect


async def test_tokens_are_stored_hashed_verified_listed_and_revoked() -> None:
    redis = connect(None)
    store = TokenStore(redis)
    token, info = await store.create("team-a", ["read", "write"], "ci")
    assert token.startswith("acpb_") and info.tenant == "team-a"
    stored = " ".join([str(v) for v in (await commands(redis).get(f"acpb:token:{info.id}"),)])
    assert token.split("_", 2)[2] not in stored  # the secret is never stored
    principal = await store.verify(token)
    assert principal.tenant == "team-a" and principal.may(Scope.WRITE)
    assert not principal.may(Scope.ADMIN)
    assert [t.id for t in await store.list("team-a")] == [info.id]
    assert await store.list("team-b") == []
    for forged in (
        token[:-1] + ("x" if token[-1] != "x" else "y"),
        "acpb_nope_secret",
        "x",
        f"acpb_{info.id}_",
        "acpb__",
    ):
        with pytest.raises(AuthError):
            await store.verify(forged)
    assert await store.revoke(info.id)
    with pytest.raises(AuthError):
        await store.verify(token)
    assert not await store.revoke("missing")
    with pytest.raises(ValueError):
        await store.create("team-a", ["root"])
    await redis.aclose()


SECRET = "a-unit-test-secret-32-bytes-long!"


def _hs(claims: dict, secret: str = SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


def _claims(**extra: object) -> dict:
    return {
        "tenant": "t1",
        "sub": "u1",
        "exp": int(time.time()) + 60,
        "iss": "me",
        "aud": "acp",
        **extra,
    }


def test_hs256_jwt_checks_signature_issuer_audience_and_expiry() -> None:
    verifier = JwtVerifier(JwtConfig(secret=SECRET, issuer="me", audience="acp"))
    principal = verifier.verify(_hs(_claims(scope="read")))
    assert principal.tenant == "t1" and principal.scopes == {"read"}
    refused = [
        _hs(_claims(), secret="another-secret-also-32-bytes-long"),  # forged
        _hs(_claims(exp=int(time.time()) - 3600)),  # expired
        _hs(_claims(aud="someone-else")),  # wrong audience
        _hs(_claims(iss="mallory")),  # wrong issuer
        _hs({k: v for k, v in _claims().items() if k != "tenant"}),  # no tenant
        _hs({k: v for k, v in _claims().items() if k != "exp"}),  # never expires
        "not.a.jwt",
    ]
    for token in refused:
        with pytest.raises(AuthError):
            verifier.verify(token)


def test_rs256_with_a_public_key_and_es256_with_a_jwks_file(tmp_path: Path) -> None:
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / "pub.pem").write_bytes(pem)
    verifier = JwtVerifier(
        JwtConfig(public_key_file=str(tmp_path / "pub.pem"), audience="acp", issuer="me")
    )
    assert verifier.verify(jwt.encode(_claims(), rsa_key, algorithm="RS256")).tenant == "t1"
    with pytest.raises(AuthError):  # an HS256 token: the verifier takes RS256 only
        verifier.verify(_hs(_claims()))

    ec_key = ec.generate_private_key(ec.SECP256R1())
    jwk = jwt.algorithms.ECAlgorithm.to_jwk(ec_key.public_key(), as_dict=True)
    jwk["kid"] = "k1"
    (tmp_path / "jwks.json").write_text(__import__("json").dumps({"keys": [jwk]}))
    verifier = JwtVerifier(
        JwtConfig(jwks_file=str(tmp_path / "jwks.json"), audience="acp", issuer="me")
    )
    good = jwt.encode(_claims(), ec_key, algorithm="ES256", headers={"kid": "k1"})
    assert verifier.verify(good).subject == "jwt:u1"
    with pytest.raises(AuthError):
        verifier.verify(jwt.encode(_claims(), ec_key, algorithm="ES256", headers={"kid": "k2"}))
