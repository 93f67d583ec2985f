"""Head starts fitted before training: routers from the sub-layers' update sizes (router_init), stand-ins from the sub-layers' updates (standin_fit)."""
