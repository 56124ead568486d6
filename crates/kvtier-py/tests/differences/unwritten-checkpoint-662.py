# kvtier differential script: python differential.py --replay FILE
{
    'version': 1,
    'seed': 662,
    'hybrid': True,
    'config': {
        'page_size': 2,
        'decode_input_tokens': 1,
        'max_batch_size': 1,
        'max_scheduled_tokens': 2,
        'enable_mixed_prefill_decode': False,
        'enable_kv_cache_events': True,
        'disable_l2_cache': True,
        'disable_prefix_cache': True,
        'num_device_pages': 4,
        'num_host_pages': 0,
        'enable_mamba': True,
        'mamba_cache_chunk_size': 4,
        'mamba_pool_total_chunks': 34,
    },
    'requests': [
        {'id': 'r01', 'arrive': 0, 'prompt': [1, 1], 'gen': 1, 'abort_at': None, 'reserve': {}},
        {'id': 'r03', 'arrive': 0, 'prompt': [1, 1, 1], 'gen': 1, 'abort_at': None, 'reserve': {}},
    ],
    'wb_delays': {},
    'max_steps': 400,
}
