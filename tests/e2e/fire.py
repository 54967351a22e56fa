"""A renter process for load tests: fires requests concurrently, records answers."""

from __future__ import annotations

import asyncio

import httpx


async def _fire(urls: list[str], api_key: str, count: int, tag: str) -> list[dict]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(300)) as client:

        async def one(i: int) -> dict:
            url = urls[i % len(urls)]
            response = await client.post(
                url + "/v1/chat/completions",
                headers={"Authorization": f"Bearer {api_key}"},
                json={
                    "model": "smollm2-135m-instruct",
                    "messages": [{"role": "user", "content": f"{tag}-{i}"}],
                    "max_tokens": 16,
                },
            )
            try:
                body = response.json()
            except ValueError:
                body = {"error": response.text[:2000]}
            text = (
                body["choices"][0]["message"]["content"]
                if response.status_code == 200
                else None
            )
            return {
                "status": response.status_code,
                "job": response.headers.get("x-ballast-job-id"),
                "text": text,
                "error": body.get("error"),
            }

        return await asyncio.gather(*(one(i) for i in range(count)))


def fire(urls: list[str], api_key: str, count: int, tag: str) -> list[dict]:
    """Send ``count`` chat requests at once, spread over ``urls``; return the answers."""
    return asyncio.run(_fire(urls, api_key, count, tag))
