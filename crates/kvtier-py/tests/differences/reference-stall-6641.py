# kvtier differential script: python differential.py --replay FILE
{
    'version': 1,
    'seed': 6641,
    'hybrid': False,
    'config': {
        'page_size': 4,
        'decode_input_tokens': 1,
        'max_batch_size': 6,
        'max_scheduled_tokens': 21,
        'enable_mixed_prefill_decode': False,
        'enable_kv_cache_events': True,
        'disable_l2_cache': False,
        'disable_prefix_cache': False,
        'num_device_pages': 8,
        'num_host_pages': 0,
    },
    'requests': [
        {'id': 'r01', 'arrive': 0, 'prompt': [1, 1], 'gen': 3, 'abort_at': None, 'reserve': {}},
        {'id': 'r00', 'arrive': 0, 'prompt': [1, 1], 'gen': 3, 'abort_at': None, 'reserve': {}},
        {
            'id': 'r03',
            'arrive': 0,
            'prompt': [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
            'gen': 1,
            'abort_at': 5,
            'reserve': {},
        },
    ],
    'wb_delays': {},
    'max_steps': 400,
}
