# kvtier differential script: python differential.py --replay FILE
{
    'version': 1,
    'seed': 4,
    'hybrid': False,
    'config': {
        'page_size': 2,
        'decode_input_tokens': 1,
        'max_batch_size': 7,
        'max_scheduled_tokens': 64,
        'enable_mixed_prefill_decode': False,
        'enable_kv_cache_events': True,
        'disable_l2_cache': False,
        'disable_prefix_cache': False,
        'num_device_pages': 5,
        'num_host_pages': 146,
    },
    'requests': [
        {'id': 'r02', 'arrive': 0, 'prompt': [33, 14], 'gen': 2, 'abort_at': None, 'reserve': {}},
        {'id': 'r05', 'arrive': 0, 'prompt': [33], 'gen': 2, 'abort_at': None, 'reserve': {}},
    ],
    'wb_delays': {},
    'max_steps': 400,
}
