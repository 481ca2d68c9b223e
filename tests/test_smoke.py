async def test_healthz(client):
    resp = await client.get("/healthz")
    assert resp.status == 200


async def test_me(client, owner):
    resp = await client.get("/api/v1/me", headers=owner["headers"])
    assert resp.status == 200
    body = await resp.json()
    assert body["org_slug"] == "acme" and body["role"] == "owner" and body["member_id"] == owner["member_id"]
