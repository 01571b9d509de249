import dreamlake.lakeshore as dls


@dls.udf(queue="hello-demo")
def hello(name: str) -> dict:
    return {"greeting": f"hello, {name}"}


def main():
    dp = dls.Dispatch(":memory:")
    q = dls.SyncQueue("hello-demo", dispatch=dp)

    inv = hello.submit("lakeshore", _dispatch=dp)  # a durable invocation id
    print(f"submitted {inv}")

    dls.run_worker(q, once=True)  # drain exactly one job, in this thread
    print(q.result(inv, timeout=30))


if __name__ == "__main__":
    main()
