"""Routers and how a forward routes: Router / RouterSet, the stand-ins a skipped cell may run, Plan (a request's routers, threshold and KV policy), Gate and decide."""
