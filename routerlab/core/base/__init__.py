"""What every other part of core/ stands on: errors, configs, where assets are, the device and its float type, the long documents."""
