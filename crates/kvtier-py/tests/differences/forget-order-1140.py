# kvtier differential script: python differential.py --replay FILE
{
    'version': 1,
    'seed': 1140,
    'hybrid': True,
    'config': {
        'page_size': 4,
        'decode_input_tokens': 1,
        'max_batch_size': 4,
        'max_scheduled_tokens': 2,
        'enable_mixed_prefill_decode': False,
        'enable_kv_cache_events': True,
        'disable_l2_cache': False,
        'disable_prefix_cache': False,
        'num_device_pages': 10,
        'num_host_pages': 0,
        'paged_cache_groups': [
            {
                'group_id': 'full',
                'rows_per_page': 2,
                'entry_stride_tokens': 2,
                'retention': 'FullHistory',
                'sliding_window_tokens': None,
                'family': 'History',
                'total_pages': 49,
            },
        ],
        'prefix_cache_adjunct': ['full'],
    },
    'requests': [
        {'id': 'r04', 'arrive': 0, 'prompt': [1, 1], 'gen': 3, 'abort_at': None, 'reserve': {}},
        {'id': 'r01', 'arrive': 0, 'prompt': [1], 'gen': 12, 'abort_at': None, 'reserve': {}},
        {'id': 'r02', 'arrive': 0, 'prompt': [1], 'gen': 12, 'abort_at': None, 'reserve': {}},
    ],
    'wb_delays': {},
    'max_steps': 400,
}
