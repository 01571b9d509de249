import asyncio
import threading

import dreamlake.lakeshore as dls


@dls.udf(queue="fan-out-demo")
def slow_square(x: int, delay: float) -> int:
    import time

    time.sleep(delay)
    return x * x


async def fan_out(n: int, dp) -> None:
    q = dls.Queue("fan-out-demo", dispatch=dp)
    ids = [slow_square.submit(i, delay=(n - i) * 0.05, _dispatch=dp) for i in range(n)]

    async def one(i: int, inv: str) -> tuple[int, int]:
        return i, await q.result(inv, timeout=30)

    for fut in asyncio.as_completed([one(i, inv) for i, inv in enumerate(ids)]):
        i, r = await fut
        print(f"  completed: slow_square({i}) = {r}")


def main(n: int = 10):
    dp = dls.Dispatch(":memory:")
    done = threading.Event()
    workers = [
        threading.Thread(
            target=dls.run_worker,
            args=(dls.SyncQueue("fan-out-demo", dispatch=dp),),
            kwargs={"stop": done.is_set},
            daemon=True,
        )
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()

    asyncio.run(fan_out(n, dp))
    done.set()
    for worker in workers:
        worker.join(timeout=5)


if __name__ == "__main__":
    main()
